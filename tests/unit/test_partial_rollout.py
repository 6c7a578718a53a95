"""``rollout.partial_rollout`` (``minirl.partial_rollout``): a pool decoded in chunks across steps, by hand with a
scripted engine; the continuation of a response in the real engine is exact; stale tokens masked; the config's lines."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from minirl.batching import collate
from minirl.config import ConfigError, load_config
from minirl.partial_rollout import PartialPool, continued
from minirl.rollout.base import DecodeControl
from minirl.tasks.chat import cut_at_stop_strings
from minirl.types import Completion, Prompt
from tests.distributed.common import run_steps

EOS = 0
M = 6  # max_new_tokens
SCRIPTS = {  # each prompt's two responses; a script shorter than M ends with a stop (finish "eos")
    "A": [[1, 2], [3, 4, 5]],
    "B": [[6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]],
    "C": [[17, 18], [19, 20]],
    "D": [[21], [22]],
    "E": [[23, 24, 25], [26]],
    "F": [[27, 28, 29, 30], [31]],
}


class ScriptedEngine:
    """Continues each response by its script: which response a prompt is, its prefix tells (an empty one: the
    order of the prompt's empty rows in the call). logp of token t is -t / 10. Records the calls (prompts, prefix
    lengths, the longest budget). With ``in_call`` it decodes token by token and asks the control's stop every
    ``check_every_tokens`` tokens, as ``NativeEngine`` does."""

    def __init__(self, in_call: bool = False) -> None:
        self.in_call = in_call
        self.calls: list[tuple[list[str], list[int], int]] = []

    def __call__(self, prompts: list[Prompt], call: int, control: DecodeControl) -> list[Completion]:
        budgets = control.max_new_tokens
        assert (control.stop is not None) == self.in_call and len(budgets) == len(prompts)
        self.calls.append(([p.text for p in prompts], [len(p.response_prefix or []) for p in prompts], max(budgets)))
        scripts, fresh = [], {}
        for p in prompts:
            prefix = list(p.response_prefix or [])
            if prefix:
                script = next(s for s in SCRIPTS[p.text] if s[: len(prefix)] == prefix)
            else:
                script = SCRIPTS[p.text][fresh.setdefault(p.text, 0)]
                fresh[p.text] += 1
            scripts.append((prefix, script[len(prefix):]))
        lengths = [min(len(rest), budget) for (_, rest), budget in zip(scripts, budgets)]
        for step in range(1, max(budgets) + 1):
            if control.stop is not None and step % control.check_every_tokens == 0 and step < max(lengths) \
                    and control.stop([n <= step for n in lengths]):
                lengths = [min(n, step) for n in lengths]
                break
        out = []
        for (prefix, rest), n in zip(scripts, lengths):
            new = rest[:n]
            ends = n == len(rest) and len(prefix) + n < M
            out.append(Completion(0, 0, [100] + prefix, new, torch.tensor([-t / 10 for t in new]),
                                  "eos" if ends else "length"))
        return out


def _draw(texts: list[str]):
    prompts = iter(Prompt(text, "") for text in texts)
    return lambda k: [next(prompts) for _ in range(k)]


def _score(prompts, completions):
    """Reward: the response's length; stats: its mean."""
    rewards = torch.tensor([float(len(c.completion_ids)) for c in completions])
    return rewards, {"reward/len_mean": float(rewards.mean())}, [{} for _ in completions]


def _merge(row, new, step):
    return continued(row, new, step, max_new_tokens=M, finish=lambda c: c)


def _sample(pool, step, engine, draw, *, groups=1, batch=2, filtered=None, max_draws=10):
    return pool.sample(step, draw=draw, generate=engine, score=_score, merge=_merge, groups=groups, pool=batch,
                       chunk_tokens=2, filtered=filtered, max_draws=max_draws, in_call=engine.in_call)


def test_a_pool_trains_the_groups_that_end_first_and_continues_the_rest_next_step():
    """P = 1 of a batch of 2 prompts, chunks of 2 tokens: step 1 ends A after two chunks and leaves B half done; step
    2 fills its batch with C, finishes B on its weights (its last tokens marked step 2) and trains it, dropping C,
    which ended with it; step 3 trains D and carries E. Every figure by hand."""
    pool, engine, draw = PartialPool(2, M), ScriptedEngine(), _draw(list("ABCDE"))
    one = _sample(pool, 1, engine, draw)
    assert [p.text for p in one.prompts] == ["A"] and [c.completion_ids for c in one.completions] == [[1, 2], [3, 4, 5]]
    assert [c.sampled_at_steps.tolist() for c in one.completions] == [[1, 1], [1, 1, 1]]
    assert engine.calls == [(list("AABB"), [0, 0, 0, 0], 2), (list("ABB"), [2, 2, 2], 2)]
    assert one.rewards.tolist() == [2.0, 3.0] and one.generated_tokens == 8 + 5
    assert [r for r in pool.running[0].rows] and [len(r.completion_ids) for r in pool.running[0].rows] == [4, 4]
    assert (one.reward_stats["rollout/chunks"], one.reward_stats["rollout/partial_pool_groups"]) == (2.0, 1.0)
    assert one.reward_stats["rollout/stale_tokens_frac"] == 0.0

    two = _sample(pool, 2, engine, draw)  # the batch: B carried over first, C new to fill it
    assert [p.text for p in two.prompts] == ["B"] and engine.calls[2] == (list("BBCC"), [4, 4, 0, 0], 2)
    b0, b1 = two.completions
    assert (b0.completion_ids, b1.completion_ids) == ([6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16])
    assert (b0.finish_reason, b1.finish_reason) == ("eos", "length")
    assert (b0.sampled_at_steps.tolist(), b1.sampled_at_steps.tolist()) == ([1, 1, 1, 1, 2], [1, 1, 1, 1, 2, 2])
    torch.testing.assert_close(b1.logp_rollout, torch.tensor([-1.1, -1.2, -1.3, -1.4, -1.5, -1.6]), rtol=0, atol=0)
    assert b0.prompt_ids == [100] and (b0.prompt_index, b1.sample_index) == (0, 1)
    s = two.reward_stats  # C ended in the same chunk, beyond the batch: dropped, as slime drops it
    assert (s["rollout/stale_tokens_frac"], s["rollout/partial_responses_frac"], s["rollout/max_token_lag_steps"]) == \
        (8 / 11, 1.0, 1.0)
    assert two.generated_tokens == 1 + 2 + 2 + 2 and s["reward/len_mean"] == 5.5
    assert (s["rollout/partial_dropped_groups"], s["rollout/partial_pool_groups"]) == (1.0, 0.0)

    three = _sample(pool, 3, engine, draw)  # a new batch, D and E: D ends in the first chunk, E goes on
    assert [p.text for p in three.prompts] == ["D"] and engine.calls[3] == (list("DDEE"), [0, 0, 0, 0], 2)
    s = three.reward_stats
    assert (s["rollout/partial_dropped_groups"], s["rollout/partial_pool_groups"], s["rollout/chunks"]) == (0.0, 1.0, 1.0)
    assert [g.prompt.text for g in pool.running] == ["E"]


def test_the_pool_survives_a_checkpoint():
    """``state`` / ``load_state``: a pool reloaded after step 1 gives step 2 as the pool that never stopped."""
    pool, engine = PartialPool(2, M), ScriptedEngine()
    texts = list("ABCDE")
    prompts = [Prompt(t, "") for t in texts]
    draw = iter(prompts)
    _sample(pool, 1, engine, lambda k: [next(draw) for _ in range(k)])
    path = Path(tempfile.mkdtemp()) / "state.pt"
    torch.save(pool.state(prompts), path)
    reloaded = PartialPool(2, M)
    reloaded.load_state(torch.load(path, weights_only=True), prompts)  # plain enough for a weights_only checkpoint
    a, b = (_sample(p, 2, ScriptedEngine(), _draw(texts[2:])) for p in (pool, reloaded))  # the same prompts next
    assert [c.completion_ids for c in a.completions] == [c.completion_ids for c in b.completions]
    assert all(torch.equal(x.logp_rollout, y.logp_rollout) and torch.equal(x.sampled_at_steps, y.sampled_at_steps)
               for x, y in zip(a.completions, b.completions))
    assert a.prompts[0] is prompts[1] and b.prompts[0] is prompts[1]


def test_with_filter_groups_a_zero_spread_group_is_dropped_and_more_prompts_drawn():
    """C's two responses have the same length (reward), so no spread: dropped when it ends, and a batch more is
    drawn (E, whose lengths differ); with the draws spent, the zero-spread group fills the batch."""
    def spread(rewards):
        return bool((rewards != rewards[0]).any())

    pool, engine = PartialPool(2, M), ScriptedEngine()
    got = _sample(pool, 1, engine, _draw(["C", "E"]), batch=1, filtered=spread)
    assert [p.text for p in got.prompts] == ["E"] and [call[0] for call in engine.calls] == [["C", "C"], ["E", "E"], ["E"]]
    s = got.reward_stats
    assert (s["filter/rounds"], s["filter/kept_groups_frac"], s["filter/topped_up_groups"]) == (2.0, 0.5, 0.0)
    assert s["filter/reward_mean_generated"] == pytest.approx((2 + 2 + 3 + 1) / 4)
    short = _sample(PartialPool(2, M), 1, ScriptedEngine(), _draw(["C", "D"]), batch=1, filtered=spread, max_draws=1)
    assert [p.text for p in short.prompts] == ["C"] and short.reward_stats["filter/topped_up_groups"] == 1.0


def _steps_of(in_call: bool, texts: str, steps: int, **kwargs) -> tuple[list[tuple], list[list]]:
    """Each step's trained groups (prompts, tokens, log-probs, steps sampled at) and statistics but ``chunks``; the
    engine's calls."""
    pool, engine, draw = PartialPool(2, M), ScriptedEngine(in_call), _draw(list(texts))
    got = []
    for step in range(1, steps + 1):
        one = _sample(pool, step, engine, draw, **kwargs)
        got.append(([p.text for p in one.prompts], [c.completion_ids for c in one.completions],
                    [c.logp_rollout.tolist() for c in one.completions], [c.sampled_at_steps.tolist() for c in one.completions],
                    {k: v for k, v in one.reward_stats.items() if k != "rollout/chunks"}, one.generated_tokens))
    return got, engine.calls


@pytest.mark.parametrize("texts, steps, kwargs", [
    ("ABCDE", 3, {}),  # the first test's steps
    ("AECBDF", 2, {"groups": 2, "batch": 3}),  # C ends at the first check, A and E at the second: A is kept, E dropped
    ("CEDAB", 2, {"batch": 1, "filtered": lambda rewards: bool((rewards != rewards[0]).any())}),
])
def test_one_call_a_step_trains_what_one_chunk_a_call_trains(texts, steps, kwargs):
    """The stop asked every chunk's worth of tokens sees what the chunk calls see: the same groups trained, dropped
    and carried, with the same tokens, in fewer calls (a call restarts only when a filter dropped groups)."""
    chunks, chunk_calls = _steps_of(False, texts, steps, **kwargs)
    whole, whole_calls = _steps_of(True, texts, steps, **kwargs)
    assert whole == chunks and len(whole_calls) < len(chunk_calls)
    if texts == "AECBDF":
        assert chunks[0][0] == ["C", "A"] and chunks[0][4]["rollout/partial_dropped_groups"] == 1.0
    if "filtered" not in kwargs:
        assert len(whole_calls) == steps


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_a_continued_response_is_cut_at_the_limit_and_at_a_stop_string_spanning_two_chunks():
    """``continued``: the chunk's routes cover the whole response (the last kept token's row -1 when cut); a stop
    string whose first character ended the last chunk is found in the whole text."""
    routes = torch.arange(7 * 2).view(7, 1, 2)  # prompt 1 + prefix 2 + chunk 4 positions
    row = Completion(0, 1, [100], [ord("a"), ord("x")], torch.tensor([-0.1, -0.2]), "length", "ax",
                     sampled_at_steps=torch.tensor([3, 3], dtype=torch.int32))
    new = Completion(0, 0, [100, ord("a"), ord("x")], [ord("y"), ord("z"), ord("w"), ord("v")],
                     torch.tensor([-0.3, -0.4, -0.5, -0.6]), "length", routes=routes)
    cut = continued(row, new, 4, max_new_tokens=5, finish=lambda c: c)
    assert cut.completion_ids == [97, 120, 121, 122, 119] and cut.finish_reason == "length" and cut.prompt_ids == [100]
    assert cut.sampled_at_steps.tolist() == [3, 3, 4, 4, 4] and cut.logp_rollout.tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert cut.routes.shape[0] == 6 and cut.routes[-1].tolist() == [[-1, -1]] and torch.equal(cut.routes[:5], routes[:5])
    tokenizer = CharTokenizer()

    def finish(c):
        c.text = tokenizer.decode(c.completion_ids)
        return cut_at_stop_strings(c, tokenizer, ("xy",))

    stopped = continued(row, new, 4, max_new_tokens=32, finish=finish)
    assert stopped.completion_ids == [97, 120, 121] and stopped.finish_reason == "eos" and stopped.text == "axy"
    assert stopped.sampled_at_steps.tolist() == [3, 3, 4] and stopped.routes.shape[0] == 4


def test_stale_tokens_train_nothing_under_partial_mask_stale():
    c = Completion(0, 0, [5, 6], [7, 8, 9], torch.tensor([-1.0, -2.0, -3.0]), "eos",
                   sampled_at_steps=torch.tensor([2, 3, 3], dtype=torch.int32))
    whole = collate([c], torch.ones(1), pad_token_id=0)
    fresh = collate([c], torch.ones(1), pad_token_id=0, trained_from_step=3)
    assert whole.mask.tolist() == [[False, True, True, True]] and fresh.mask.tolist() == [[False, False, True, True]]
    assert torch.equal(fresh.logp_rollout, whole.logp_rollout)


class _Spied:
    """The engine's rollouts with each call's prefix lengths recorded; not an ``EngineRollouts``, so the loop decodes
    one chunk per call (as with an engine without ``DecodeControl``)."""

    def __init__(self, rollouts, seen: list[int]) -> None:
        self.inner, self.seen = rollouts, seen

    def rollouts(self, step, prompts, n, sampling, *, record_routes):
        self.seen.extend(len(p.response_prefix or []) for p in prompts)
        return self.inner.rollouts(step, prompts, n, sampling, record_routes=record_routes)


@pytest.mark.parametrize("in_call, engines", [(False, 1), (True, 1), (True, 2)])
def test_in_the_engine_a_response_continued_is_the_law_it_was_sampled_from(tmp_path, in_call, engines):
    """The real engine, R3, fp32, stop strings so that lengths vary. One chunk per call: responses continued over
    several chunks (the prompt and the response so far prefilled again) in one step carry the trainer's own log-probs
    to float rounding (``mismatch/*`` at step 1, where every token is the step's). In one call (``DecodeControl``):
    the step is one engine call, its KV cache kept from check to check, with the same exactness; so too with two
    engines in this process (``EngineGroup``, one thread each, joined at every check). Either way a later step trains
    responses begun a step before, prefilled again on the new weights."""
    seen: list[int] = []
    calls: list[DecodeControl] = []

    def spy(run):
        assert (type(run.engine).__name__ == "EngineGroup") == (engines > 1)
        if not in_call:
            run.rollouts = _Spied(run.rollouts, seen)
            return
        generate = run.engine.generate

        def counted(prompts, n, sampling, record_routes=False, control=None):
            seen.extend(len(p.response_prefix or []) for p in prompts)
            calls.append(control)
            return generate(prompts, n, sampling, record_routes=record_routes, control=control)

        run.engine.generate = counted

    metrics, _ = run_steps(tmp_path, "rollout.partial_rollout=true", "rollout.partial_chunk_tokens=2",
                           "rollout.max_new_tokens=16", "moe.routing_replay=R3",
                           "task.stop_strings=[a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p]", f"cluster.rollout_engines={engines}",
                           steps=2, on_setup=spy)
    assert metrics[0]["mismatch/abs_dlogp_max"] < 2e-6 and metrics[0]["rollout/stale_tokens_frac"] == 0.0
    assert metrics[1]["rollout/stale_tokens_frac"] > 0 and metrics[1]["rollout/max_token_lag_steps"] == 1.0
    if in_call:
        assert metrics[0]["rollout/chunks"] == metrics[1]["rollout/chunks"] == 1.0 and len(calls) == 2
        assert calls[0].check_every_tokens == 2 and set(calls[0].max_new_tokens) == {16}
        assert max(calls[1].max_new_tokens) == 16 > min(calls[1].max_new_tokens) and max(seen) >= 2
    else:
        assert max(seen) >= 6 and metrics[0]["rollout/chunks"] >= 3


@pytest.mark.parametrize("overrides, message", [
    (["rollout.partial_mask_stale=true"], r"^rollout.partial_mask_stale: applies under rollout.partial_rollout=true"),
    (["rollout.partial_pool_prompts=4"], r"^rollout.partial_pool_prompts: applies under rollout.partial_rollout=true"),
    (["rollout.partial_rollout=true", "rollout.partial_pool_prompts=2"],
     r"^rollout.partial_pool_prompts: the pool must hold at least the step's prompts_per_step = 8 groups \(got 2\)"),
    (["rollout.partial_rollout=true", "algo.adv_baseline=greedy"], r"^algo.adv_baseline=greedy: .* rollout.partial_rollout"),
    (["rollout.partial_chunk_tokens=0"], r"^rollout.partial_chunk_tokens: must be greater than or equal to 1"),
])
def test_what_partial_rollouts_do_not_go_with_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_dump_or_a_rollout_source_with_partial_rollouts_is_one_line_before_any_work(tmp_path, capsys):
    from minirl.cli import main

    code = main(["train", str(Path(__file__).resolve().parents[2] / "configs/demo.yaml"), "rollout.partial_rollout=true", f"run.output_dir={tmp_path}",
                 "--dump-rollouts", str(tmp_path / "dump")])
    assert code == 2 and "--dump-rollouts with rollout.partial_rollout: a dump holds" in capsys.readouterr().err
    assert not list(tmp_path.rglob("sft"))  # refused before the cold start
    from minirl.loop import check_sources

    with pytest.raises(ConfigError, match=r"^train\(rollouts=...\) with rollout.partial_rollout"):
        check_sources(load_config(None, ["rollout.partial_rollout=true"]), rollouts=object())
