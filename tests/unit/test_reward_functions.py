"""Reward functions the TRL way: weighted lists, batched or per-sample, async, extra columns."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from minirl.tasks import (
    RewardFunctionError,
    RewardRunner,
    RewardSpecError,
    build_task,
    load_reward_function,
)
from minirl.tasks.reward_functions import looks_batched, make_reward_fn
from minirl.types import Prompt

MOD = "tests.unit.trl_style_rewards"
PROMPTS = [
    Prompt(text="2+2?", answer="4", meta={"source": "f:1", "unit": "kg", "bonus": 0.5}),
    Prompt(text="q", answer="7 kg", meta={"source": "f:2", "unit": "kg", "bonus": 2}, messages=[{"role": "user", "content": "q"}]),
]
COMPLETIONS = [(0, "4"), (0, "5"), (1, "7 kg"), (1, "7 g")]


def _runner(functions: list[dict], timeout_s: float | None = None, **kwargs) -> RewardRunner:
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=functions)
    return RewardRunner(task, timeout_s=timeout_s, **kwargs)


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in a worker process
def test_batched_and_per_sample_give_identical_rewards(timeout_s: float | None) -> None:
    with _runner([{"function": f"{MOD}:exact"}], timeout_s) as per_sample, \
         _runner([{"function": f"{MOD}:exact_batched"}], timeout_s, workers=2) as batched:
        assert batched.functions[0].batched and not per_sample.functions[0].batched
        one, _ = per_sample.score(PROMPTS, COMPLETIONS)
        many, stats = batched.score(PROMPTS, COMPLETIONS)
    assert one.tolist() == many.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert stats["reward/exact_batched/mean"] == 0.5


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_async_rewards_are_awaited(timeout_s: float | None) -> None:
    functions = [{"function": f"{MOD}:exact_async"}, {"function": f"{MOD}:exact_async_batched", "weight": 2.0}]
    with _runner(functions, timeout_s) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == [3.0, 0.0, 3.0, 0.0]
    assert stats["reward/exact_async/mean"] == stats["reward/exact_async_batched/mean"] == 0.5


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_extra_columns_arrive_as_keywords_and_weights_sum(timeout_s: float | None) -> None:
    functions = [{"function": f"{MOD}:uses_unit", "weight": 1.0}, {"function": f"{MOD}:bonus_batched", "weight": 0.5}]
    with _runner(functions, timeout_s) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    # uses_unit: only "7 kg" ends with the row's unit; bonus: the row's column, weighted 0.5
    assert rewards.tolist() == [0.25, 0.25, 2.0, 1.0]
    assert stats["reward/uses_unit/mean"] == 0.25 and stats["reward/bonus_batched/mean"] == 1.25


def test_trl_signature_works_unchanged_with_chat_prompts() -> None:
    class C:  # a Completion-like object carrying token ids
        def __init__(self, index: int, text: str, ids: list[int]) -> None:
            self.prompt_index, self.text, self.completion_ids = index, text, ids

    with _runner([{"function": f"{MOD}:trl_reward"}]) as runner:
        rewards, _ = runner.score(PROMPTS, [C(1, "7 kg", [1, 2]), C(1, "7 kg", [3]), C(1, "x", [])])
    assert rewards.tolist() == pytest.approx([1.02, 1.01, 0.0])


def test_a_trl_function_naming_completions_anywhere_is_batched_and_called_by_keyword() -> None:
    """TRL calls every reward function by keyword: ``accuracy(solution, completions, **kwargs)`` and
    ``curriculum(trainer_state, completions, **kwargs)`` work there, whatever their order; here too."""
    from minirl.tasks.reward_functions import Sample, TrainerState

    def accuracy(solution, completions, **kwargs):
        return [float(s in c) for s, c in zip(solution, completions)]

    def curriculum(trainer_state, completions, **kwargs):
        return [float(trainer_state.global_step)] * len(completions)

    samples = [Sample("q", "a 7", "7", columns={"solution": "7"}, trainer_state=TrainerState(3, 9)),
               Sample("q", "b", "8", columns={"solution": "8"}, trainer_state=TrainerState(3, 9))]
    assert looks_batched(accuracy) and make_reward_fn(accuracy).score(samples) == [1.0, 0.0]
    assert looks_batched(curriculum) and make_reward_fn(curriculum).score(samples) == [3.0, 3.0]


def test_a_function_fitting_neither_call_is_one_line_at_once() -> None:
    """TRL's docs' ``reward_func(completions_ids, **kwargs)`` (a typo) fits neither TRL's batched keyword call nor the
    per-sample ``fn(prompt, completion, answer)``: one line when the function is given, naming the keyword it is near."""
    from minirl.tasks.rewards import RewardSpecError

    def reward_func(completions_ids, **kwargs):
        return [0.0] * len(completions_ids)

    with pytest.raises(RewardSpecError, match=r"its parameters \(completions_ids, kwargs\) fit neither TRL's batched "
                                              r"call .* did you mean 'completion_ids'\?$"):
        make_reward_fn(reward_func)
    assert not make_reward_fn(lambda prompt, completion, answer=None: 1.0).batched  # three positional: per sample


def test_batched_detection_follows_trl_or_the_flag() -> None:
    fns = __import__(MOD, fromlist=["x"])
    assert looks_batched(fns.trl_reward) and looks_batched(fns.bonus_batched) and not looks_batched(fns.exact)
    assert make_reward_fn(f"{MOD}:exact", batched=True).batched  # the flag wins


def test_a_batched_function_returning_the_wrong_length_is_one_line() -> None:
    with _runner([{"function": f"{MOD}:wrong_length"}]) as runner, pytest.raises(RewardFunctionError) as error:
        runner.score(PROMPTS, COMPLETIONS)
    assert str(error.value) == f"reward function {MOD}:wrong_length returned 1 rewards for 4 completions"


def test_a_batched_function_may_return_an_array_or_a_tensor_as_in_trl() -> None:
    """TRL iterates over what a reward function returns: a numpy array or a torch tensor works there, and here."""
    import numpy as np

    from minirl.tasks.reward_functions import Sample

    samples = [Sample("q", "a", "a"), Sample("q", "b", "a")]
    for values in (np.array([1.0, 0.5]), torch.tensor([1.0, 0.5])):
        fn = make_reward_fn(lambda completions, values=values, **kwargs: values)
        assert fn.batched and fn.score(samples) == [1.0, 0.5]


def test_an_answer_column_kept_as_stored_is_not_passed_twice() -> None:
    """A number, list or object answer is kept as stored among the columns (TRL's batched functions read it); a
    per-sample ``f(prompt, completion, answer, **kwargs)`` gets it once, in ``answer``."""
    from minirl.tasks.jsonl import ColumnMap, _row_to_prompt
    from minirl.tasks.reward_functions import sample_of

    seen: list = []

    def reward(prompt, completion, answer, **kwargs):
        seen.append((answer, sorted(kwargs)))
        return 1.0

    for stored in (3, {"x": 1}, [1, 2]):
        row = _row_to_prompt({"prompt": "q", "answer": stored, "level": 2}, "f:1", ColumnMap(answer_required=False))
        assert make_reward_fn(reward).score([sample_of(row, "c")]) == [1.0]
    assert [keys for _, keys in seen] == [["completion_ids", "level"]] * 3 and [a for a, _ in seen] == ["3", "{\"x\": 1}", "[1, 2]"]


def test_module_in_the_working_directory_is_found_and_a_miss_says_where(tmp_path: Path) -> None:
    (tmp_path / "my_rewards_cwd.py").write_text("def score(prompt, completion, answer):\n    return 2.0\n")
    script = (
        "import sys; sys.path = [p for p in sys.path if p not in ('', '.', sys.argv[1])]\n"
        "from minirl.tasks import load_reward_function, RewardSpecError\n"
        "print(load_reward_function('my_rewards_cwd:score')('p', 'c', 'a'))\n"
        "try:\n    load_reward_function('not_here_xyz:score')\nexcept RewardSpecError as e:\n    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "2.0"
    assert out[1] == (f"reward function 'not_here_xyz:score': module 'not_here_xyz' not found (looked in the working "
                      f"directory {tmp_path} and on sys.path; a file path also works: 'not_here_xyz.py:score')")


def test_config_reward_functions_and_one_line_errors() -> None:
    from minirl.config import ConfigError, load_config
    from minirl.tasks import build_task_from_config

    cfg = load_config(None, [f'task.reward_functions=[{{function: "{MOD}:exact", weight: 2}}, {{function: "{MOD}:exact_batched"}}]'])
    task = build_task_from_config(cfg.task)
    assert [(f.name, f.weight, f.batched) for f in task.functions] == [("exact", 2.0, False), ("exact_batched", 1.0, True)]
    with pytest.raises(ConfigError, match=r"give either task\.reward_function"):
        load_config(None, [f"task.reward_function={MOD}:exact", f'task.reward_functions=[{{function: "{MOD}:exact"}}]'])
    with pytest.raises(RewardSpecError, match="has no attribute 'nope'"):
        build_task_from_config(load_config(None, [f'task.reward_functions=[{{function: "{MOD}:nope"}}]']).task)
    assert load_reward_function(f"{MOD}:exact")("p", " 4 ", "4") == 1.0


# --- verl's compute_score ---------------------------------------------------------------------------

VERL_PROMPTS = [  # rows as a verl parquet gives them: data_source and extra_info columns (answer: ground_truth)
    Prompt(text="q1", answer="4", meta={"source": "f:1", "data_source": "gsm8k", "extra_info": {"scale": 2.0}},
           messages=[{"role": "user", "content": "q1"}]),
    Prompt(text="q2", answer="7", meta={"source": "f:2", "data_source": "bonus", "extra_info": {"index": 3}}),
]
VERL_COMPLETIONS = [(0, "4"), (0, "5"), (1, " 7"), (1, "x")]


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in a worker process
def test_verl_compute_score_works_unchanged_per_sample_and_batched(timeout_s: float | None) -> None:
    # per sample: correct x extra_info["scale"] (default 1) + 0.5 for data_source "bonus"; the completion is
    # passed as solution_str text even for a chat prompt (verl decodes the response), the answer as ground_truth
    expected = [2.0, 0.0, 1.5, 0.5]
    for name in ("compute_score", "compute_score_batched"):
        with _runner([{"function": f"{MOD}:{name}"}], timeout_s) as runner:
            entry = runner.functions[0]
            assert entry.verl and entry.batched is (name == "compute_score_batched")
            rewards, stats = runner.score(VERL_PROMPTS, VERL_COMPLETIONS)
        assert rewards.tolist() == expected, name
        assert stats[f"reward/{name}/mean"] == 1.0
        # verl's reward_extra_info: the dict's other numbers ("acc": a bool here) are logged per function
        assert stats.get(f"reward/{name}/acc") == (0.5 if name == "compute_score" else None)
    # one task.reward_function, verl's form: detected the same way
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_function=f"{MOD}:compute_score")
    assert [task.reward(VERL_PROMPTS[i], c) for i, c in VERL_COMPLETIONS] == expected


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in a worker process (the key travels)
def test_an_entrys_key_reads_that_entry_of_the_returned_dict(timeout_s: float | None) -> None:
    """``key`` (verl's GDPO reward keys): the entry's reward is that entry of compute_score's dict, the other numbers
    logged beside it; a dict without it is one line naming the function and the key."""
    functions = [{"function": f"{MOD}:compute_score", "key": "acc", "name": "acc_part", "weight": 2.0},
                 {"function": f"{MOD}:compute_score", "name": "score_part"}]
    with _runner(functions, timeout_s) as runner:
        rewards, stats = runner.score(VERL_PROMPTS, VERL_COMPLETIONS)
        parts = runner.last_parts
    assert parts[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0] and parts[:, 1].tolist() == [2.0, 0.0, 1.5, 0.5]
    assert rewards.tolist() == [4.0, 0.0, 3.5, 0.5]  # 2 x acc + score
    assert stats["reward/acc_part/mean"] == 0.5 and stats["reward/acc_part/score"] == 1.0  # score, logged beside
    with _runner([{"function": f"{MOD}:compute_score", "key": "format"}], timeout_s) as runner:
        with pytest.raises(RewardFunctionError, match=r"compute_score returned a dict without 'format' \(the entry's key"):
            runner.score(VERL_PROMPTS, VERL_COMPLETIONS)


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # the worker process gets the kwargs too
def test_fixed_kwargs_reach_every_call(timeout_s: float | None) -> None:
    functions = [{"function": f"{MOD}:scaled_exact", "kwargs": {"scale": 2.0}},
                 {"function": f"{MOD}:scaled_batched", "kwargs": {"scale": 3.0}},
                 {"function": f"{MOD}:compute_score_kw", "kwargs": {"format_score": 0.1}}]
    with _runner(functions, timeout_s) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == pytest.approx([6.0, 0.1, 6.0, 0.1], abs=1e-6)  # float32 rewards
    assert stats["reward/compute_score_kw/mean"] == pytest.approx(0.55, abs=1e-6)
    with pytest.raises(RewardSpecError, match=r"scaled_exact takes no keyword 'scael'"):
        _runner([{"function": f"{MOD}:scaled_exact", "kwargs": {"scael": 2.0}}])


def test_verl_spec_defaults_and_one_line_errors(tmp_path: Path) -> None:
    reward_file = tmp_path / "my_verl_reward.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return float(solution_str == ground_truth)\n")
    fn = load_reward_function(str(reward_file))  # verl's custom_reward_function.path, its default name
    assert fn.__name__ == "compute_score" and make_reward_fn(str(reward_file)).verl
    (tmp_path / "no_default.py").write_text("def score(prompt, completion, answer):\n    return 1.0\n")
    with pytest.raises(RewardSpecError, match=r"has no attribute 'compute_score' \(a bare file names verl's default; "
                                              r"give '.*no_default\.py:function'\)$"):
        load_reward_function(str(tmp_path / "no_default.py"))
    with pytest.raises(RewardSpecError, match=r"expected 'package\.module:function' or 'path/to/file\.py\[:function\]'"):
        load_reward_function("my_module")
    with pytest.raises(RewardSpecError, match=r"batched=True does not fit verl's signature \(first parameter 'data_source': per-sample\)"):
        make_reward_fn(f"{MOD}:compute_score", batched=True)
    with _runner([{"function": f"{MOD}:verl_without_score"}]) as runner, pytest.raises(RewardFunctionError) as error:
        runner.score(VERL_PROMPTS, VERL_COMPLETIONS)
    assert str(error.value) == (f'reward function {MOD}:verl_without_score returned a dict without "score" (keys: acc); '
                                "verl's convention puts the reward there")


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_trl_trainer_state_reaches_reward_functions(timeout_s: float | None) -> None:
    from minirl.tasks.reward_functions import TrainerState

    functions = [{"function": f"{MOD}:progress_shaped"}, {"function": f"{MOD}:progress_per_sample", "weight": 0.01}]
    with _runner(functions, timeout_s) as runner:
        runner.trainer_state = TrainerState(global_step=3, max_steps=12)
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == pytest.approx([0.28] * 4)  # 3 / 12 + 0.01 x 3
    assert stats["reward/progress_shaped/mean"] == 0.25 and stats["reward/progress_per_sample/mean"] == 3.0


def test_the_loop_tells_reward_functions_its_progress(tmp_path: Path) -> None:
    """TRL's ``trainer_state.global_step`` = gradient updates before the completions were scored: (step - 1) x N
    for a training step's rollouts, step x N for the evaluation after it; ``max_steps`` = global steps x N; ``epoch``
    = the steps' prompts over the training prompts (transformers' fraction)."""
    import torch

    import minirl.loop as loop
    from minirl.config import load_config

    seen: list[tuple[int, int, int, float]] = []

    class Recorder:
        trainer_state = None

        def score(self, prompts, completions):
            state = self.trainer_state
            seen.append((len(completions), state.global_step, state.max_steps, state.epoch))
            return torch.zeros(len(completions)), {}

        def close(self) -> None:
            pass

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs/demo.yaml", [
        "model.preset=qwen3-moe-tiny", "task.difficulty=3", "task.num_train_prompts=16", "task.num_eval_prompts=2",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=4",
        "optim.minibatches_per_step=2", "optim.global_steps=3", "eval.every_steps=2", "eval.num_prompts=2",
        "eval.samples_per_prompt=2", "cold_start.enabled=false", "log.console=false", "run.threads=1",
        f"run.output_dir={tmp_path}", "checkpoint.every_steps=0"])
    loop.train(cfg, rewards=Recorder())
    # eval before RL (0 updates), step 1 (0), step 2 (2), eval after step 2 (4), step 3 (4), final eval (6); the
    # epoch: 2 of the 16 training prompts a step, 1/8 of an epoch
    assert seen == [(4, 0, 6, 0.0), (4, 0, 6, 0.0), (4, 2, 6, 0.125), (4, 4, 6, 0.25), (4, 4, 6, 0.25), (4, 6, 6, 0.375)]


def test_rollout_dump_and_replay_pass_the_progress_on(tmp_path: Path) -> None:
    from minirl.sources import RolloutDump, RolloutReplay
    from minirl.tasks.reward_functions import TrainerState

    class Inner:
        trainer_state = None

    inner, plain = Inner(), object()
    RolloutDump(None, inner, tmp_path / "dump").trainer_state = TrainerState(1, 2)
    assert inner.trainer_state == TrainerState(1, 2)
    replay = RolloutReplay(tmp_path / "dump", inner)
    replay.trainer_state = TrainerState(3, 4)
    assert inner.trainer_state == TrainerState(3, 4) == replay.trainer_state
    RolloutReplay(tmp_path / "dump", plain).trainer_state = TrainerState(5, 6)  # a source without one: ignored
    assert not hasattr(plain, "trainer_state")


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_none_means_the_function_does_not_apply(timeout_s: float | None, capsys: pytest.CaptureFixture) -> None:
    """TRL's rule: a function may return None for a sample; the reward sums the functions that applied (0 if
    none did) and the function's mean is over the samples it scored (TRL's nanmean)."""
    functions = [{"function": f"{MOD}:only_units", "weight": 2.0}, {"function": f"{MOD}:exact"},
                 {"function": f"{MOD}:never_applies"}]
    with _runner(functions, timeout_s) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    # only_units: 1, None, 1, None (x2); exact: 1, 0, 1, 0; never_applies: None everywhere
    assert rewards.tolist() == [3.0, 0.0, 3.0, 0.0]
    nan = math.nan  # each function's own values, for GDPO (algo.multi_objective_aggregation): NaN where it did not apply
    torch.testing.assert_close(runner.last_parts, torch.tensor([[1.0, 1.0, nan], [nan, 0.0, nan], [1.0, 1.0, nan],
                                                                [nan, 0.0, nan]]), equal_nan=True)
    assert runner.part_weights.tolist() == [2.0, 1.0, 1.0]
    assert stats["reward/only_units/mean"] == 1.0 and stats["reward/exact/mean"] == 0.5
    assert "reward/never_applies/mean" not in stats and stats["reward/errors"] == 0.0
    assert stats["reward/unscored_frac"] == 0.0
    with _runner([{"function": f"{MOD}:only_units"}], timeout_s) as runner:  # samples 1 and 3: no function applied
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and stats["reward/unscored_frac"] == 0.5
    # a batch no function scored: TRL 1.16 warns and goes on (advantages 0); so does minirl, once (a missing return?)
    with _runner([{"function": f"{MOD}:never_applies"}], timeout_s) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
        runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == [0.0] * 4 and stats["reward/unscored_frac"] == 1.0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minirl: warning:")]
    assert said == [f"minirl: warning: reward function {MOD}:never_applies returned None for every one of the 4 samples, "
                    "expected a number (None means 'does not apply', TRL's rule; some function must score a batch: a "
                    "missing return?) (said once; such a batch trains nothing, and reward/unscored_frac counts them)"]


@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_trls_log_metric_and_log_extra_reach_the_metrics_and_the_samples(timeout_s: float | None, tmp_path: Path) -> None:
    """TRL 1.16 hands reward functions ``log_metric(name, value)`` and ``log_extra(column, values)``: the metric's
    mean over the step's calls is ``reward/<function>/<name>``; the column rides with each sample to samples.jsonl."""
    from minirl.metrics import sample_rows

    functions = [{"function": f"{MOD}:logs_as_trl_does"}, {"function": f"{MOD}:logs_through_kwargs", "weight": 0.0}]
    with _runner(functions, timeout_s, workers=2) as runner:  # two workers: each gets a share and logs its own
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
        columns = runner.last_columns
    assert rewards.tolist() == [1.0, 1.0, 4.0, 3.0]
    # in workers, two shares ("4", "5" | "7 kg", "7 g") log 1.0 and 3.5, each sample carrying its share's; in one
    # call (1 + 1 + 4 + 3) / 4: the mean over samples is 2.25 either way
    assert stats["reward/logs_as_trl_does/mean_length"] == pytest.approx(2.25)
    assert stats["reward/logs_through_kwargs/calls"] == 1.0
    assert [c["first_char"] for c in columns] == ["4", "5", "7", "7"]
    rows = sample_rows(PROMPTS, [SimpleNamespace(prompt_index=i, text=t) for i, t in COMPLETIONS], rewards, 2, columns)
    assert rows[1] == {"first_char": "5", "prompt": "2+2?", "completion": "5", "reward": 1.0}
    # task.environment: the prompt the model saw, with the text its environment's reset() added
    seen = Prompt(text="2+2? (reset)", answer="4", messages=[{"role": "user", "content": "2+2? (reset)"}])
    rows = sample_rows(PROMPTS, [SimpleNamespace(prompt_index=0, text="4", environment_prompt=seen)], rewards, 1)
    assert rows == [{"prompt": [{"role": "user", "content": "2+2? (reset)"}], "completion": "4", "reward": 1.0}]


def test_keyword_only_functions_and_the_datasets_own_columns_as_trl_passes_them() -> None:
    fns = __import__(MOD, fromlist=["x"])
    assert looks_batched(fns.from_kwargs_only) and not looks_batched(fns.exact)
    rows = [Prompt(text="a?", answer="4", meta={"source": "f:1", "answers": {"text": ["4", "four"]}}),
            Prompt(text="b?", answer="7", meta={"source": "f:2", "answers": {"text": ["seven"]}})]
    functions = [{"function": f"{MOD}:from_kwargs_only"}, {"function": f"{MOD}:squad_answers", "weight": 10.0}]
    with _runner(functions) as runner:
        rewards, _ = runner.score(rows, [(0, "4"), (1, "7")])
    assert rewards.tolist() == [11.0, 1.0]  # "7" is the answer, but not in the row's own answers column


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in worker processes
def test_a_slime_group_rm_that_fails_loses_its_group_alone(timeout_s: float | None) -> None:
    """slime's ``--group-rm``: one call per prompt's group; with the fallback, a group whose call raised falls back and
    the other groups keep their rewards (one call over a worker's share failed them all before)."""
    prompts = [Prompt(text=f"q{n}", answer=a, meta={"source": f"f:{n}"}) for n, a in enumerate("abc")]
    completions = [(p, text) for p in range(3) for text in ("x", "y")]
    functions = [{"function": f"{MOD}:group_rm_fails_on_b", "convention": "slime", "batched": True}]
    with _runner(functions, timeout_s, workers=1, on_error="fallback", fallback_reward=-1.0) as runner:
        rewards, stats = runner.score(prompts, completions)
    assert rewards.tolist() == [2.0, 2.0, -1.0, -1.0, 2.0, 2.0]
    assert stats["reward/errors"] == 2.0 and "judge down" in runner.last_problems[0]


def test_an_async_def_in_a_worker_awaits_its_samples_together_each_within_the_timeout() -> None:
    """An ``async def`` per-sample reward in a worker process (a timeout is set): its samples' calls are awaited
    together, as in this process, each bounded by the timeout there; a call that never answers is that sample's
    timeout, the others keep their rewards, and the worker lives on."""
    import time

    with _runner([{"function": f"{MOD}:waits_for_all"}], 5.0, workers=1) as runner:
        rewards, _ = runner.score(PROMPTS, COMPLETIONS)  # one at a time, the first call would wait 3 s and raise
    assert rewards.tolist() == [1.0, 1.0, 1.0, 1.0]
    with _runner([{"function": f"{MOD}:hangs_on_g"}], 0.5, workers=1, on_error="fallback", fallback_reward=-1.0) as runner:
        started = time.perf_counter()
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
        assert time.perf_counter() - started < 3.0
        assert runner.last_problems == [f"reward function {MOD}:hangs_on_g did not return within 0.5 s "
                                        "(task.reward_timeout_s)"]
        pid = runner._workers[0].proc.pid
        assert runner.score(PROMPTS, COMPLETIONS[:1])[0].tolist() == [1.0] and runner._workers[0].proc.pid == pid
    assert rewards.tolist() == [1.0, 1.0, 1.0, -1.0]
    assert (stats["reward/timeouts"], stats["reward/errors"]) == (1.0, 0.0)


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in worker processes
def test_openrlhfs_reward_func_is_called_its_way_in_a_worker_too(timeout_s: float | None) -> None:
    """A worker process builds the function's ``RewardFn`` with every field the runner's has (OpenRLHF's convention
    was lost there: the function was called TRL's way)."""
    with _runner([{"function": f"{MOD}:reward_func"}], timeout_s, workers=2) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert stats["reward/reward_func/length"] == pytest.approx((5 + 5 + 5 + 4) / 4)  # "2+2?4", "q7 kg"


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process (no timeout), and in a worker with one
def test_an_async_defs_own_timeout_error_is_its_error_not_the_runs_timeout(timeout_s: float | None) -> None:
    with _runner([{"function": f"{MOD}:own_timeout"}], timeout_s, workers=1, on_error="fallback") as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS[:2])
    assert rewards.tolist() == [0.0, 0.0] and (stats["reward/errors"], stats["reward/timeouts"]) == (2.0, 0.0)
    assert runner.last_problems[0].startswith(f"reward function {MOD}:own_timeout raised TimeoutError: judge took too "
                                              "long (at tests/unit/trl_style_rewards.py:")


def test_an_async_def_that_blocks_its_event_loop_is_not_timed_out_for_running_one_by_one() -> None:
    """Its calls cannot overlap (each blocks the worker's loop), so a chunk of 4 takes 4 x 0.45 s: more than the 0.5 s
    timeout and the grace together, less than the timeout per sample of the chunk, which is what the worker gets."""
    with _runner([{"function": f"{MOD}:blocks_the_loop"}], 0.5, workers=1, on_error="fallback", fallback_reward=-1.0) as runner:
        rewards, stats = runner.score(PROMPTS, COMPLETIONS)
    assert rewards.tolist() == [1.0] * 4 and stats["reward/timeouts"] == 0.0
