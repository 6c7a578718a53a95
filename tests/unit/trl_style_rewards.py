"""Reward functions written the way TRL and minirl users write them (imported by spec in tests)."""

from __future__ import annotations

import asyncio


def text(completion):
    """A completion is text, or (for a chat prompt) [{"role": "assistant", "content": text}]."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def exact(prompt, completion, answer):  # minirl's per-sample form
    return 1.0 if text(completion).strip() == answer else 0.0


def exact_batched(prompts, completions, answers, **columns):  # minirl's batched form
    return [1.0 if text(c).strip() == a else 0.0 for c, a in zip(completions, answers)]


def trl_reward(prompts, completions, completion_ids, **kwargs):  # TRL's exact convention
    """Conversational rows: completions are [{"role": "assistant", "content": ...}]; columns as lists."""
    texts = [completion[0]["content"] for completion in completions]  # as TRL's docs write it, chat rows only
    return [float(t.strip() == a) + 0.01 * len(ids) for t, a, ids in zip(texts, kwargs["answer"], completion_ids)]


def uses_unit(prompt, completion, answer, *, unit):  # a keyword-only extra column
    return 1.0 if text(completion).strip().endswith(unit) else 0.0


def bonus_batched(completions, bonus, **kwargs):  # only the names it wants, plus **kwargs
    return [float(b) for b in bonus]


async def exact_async(prompt, completion, answer):
    await asyncio.sleep(0)
    return 1.0 if text(completion).strip() == answer else 0.0


async def exact_async_batched(prompts, completions, answers, **kwargs):
    await asyncio.sleep(0)
    return [1.0 if text(c).strip() == a else 0.0 for c, a in zip(completions, answers)]


def slow_batched(prompts, completions, **kwargs):
    while True:
        pass


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # verl's NaiveRewardManager form
    """verl's convention: all by keyword; a dict result carries the reward under "score"."""
    correct = solution_str.strip() == ground_truth
    return {"score": float(correct) * extra_info.get("scale", 1.0) + (0.5 if data_source == "bonus" else 0.0),
            "acc": correct}


def compute_score_batched(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):  # verl's BatchRewardManager
    return [float(s.strip() == g) * e.get("scale", 1.0) + (0.5 if d == "bonus" else 0.0)
            for d, s, g, e in zip(data_sources, solution_strs, ground_truths, extra_infos)]


def verl_without_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": 1.0}


def progress_shaped(completions, trainer_state, **kwargs):  # TRL passes trainer_state for progress-based shaping
    return [trainer_state.global_step / trainer_state.max_steps] * len(completions)


def progress_per_sample(prompt, completion, answer, **kwargs):
    state = kwargs["trainer_state"]
    return float(state.global_step)


def only_units(completions, unit, **kwargs):  # TRL: None where the function does not apply
    return [None if u == "kg" and i % 2 else 1.0 for i, u in enumerate(unit)]


def never_applies(prompt, completion, answer):
    return None


def search_r1_style(data_source, solution_str, ground_truth, extra_info=None):  # verl: ground_truth as stored
    return float(solution_str.strip() in ground_truth["target"])


def scaled_exact(prompt, completion, answer, *, scale):  # a fixed keyword from the config (kwargs)
    return scale * float(text(completion).strip() == answer)


def scaled_batched(completions, answers, scale, **kwargs):  # TRL's form with a fixed keyword
    return [scale * float(text(c).strip() == a) for c, a in zip(completions, answers)]


def compute_score_kw(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):  # verl reward_kwargs
    return 1.0 if solution_str.strip() == ground_truth else format_score


def logs_as_trl_does(completions, log_metric, log_extra, **kwargs):  # TRL 1.16's logging keywords
    texts = [text(c) for c in completions]
    log_metric("mean_length", sum(len(t) for t in texts) / len(texts))
    log_extra("first_char", [t[:1] for t in texts])
    return [float(len(t)) for t in texts]


def logs_through_kwargs(completions, **kwargs):  # the same, reaching them through **kwargs
    kwargs["log_metric"]("calls", 1.0)
    return [0.0] * len(completions)


def length_reward(completions, **kwargs):  # a second objective, on another scale than correctness
    return [len(text(c)) / 10 for c in completions]


def from_kwargs_only(**kwargs):
    """TRL calls every reward function with keywords: one taking them alone is batched."""
    return [float(completion == answer) for completion, answer in zip(kwargs["completions"], kwargs["answer"])]


def squad_answers(completions, answers, **kwargs):
    """A dataset's own ``answers`` column (SQuAD's dicts) reaches the function as stored, not minirl's answer list."""
    return [float(completion in entry["text"]) for completion, entry in zip(completions, answers)]


def group_rm_fails_on_b(args, samples, **kwargs):  # slime's --group-rm form; raises on the group answering "b"
    if any(sample.label == "b" for sample in samples):
        raise ValueError("judge down")
    return [float(len(samples))] * len(samples)


_STARTED: list[str] = []


async def waits_for_all(prompt, completion, answer):  # returns only once every one of the 4 calls has started
    _STARTED.append(text(completion))
    for _ in range(300):
        if len(_STARTED) >= 4:
            return 1.0
        await asyncio.sleep(0.01)
    raise RuntimeError("called one at a time")


async def hangs_on_g(prompt, completion, answer):  # a judge that never answers for "7 g"
    await asyncio.sleep(60 if text(completion) == "7 g" else 0)
    return 1.0


def reward_func(queries, prompts, labels):  # OpenRLHF's --remote_rm_url form, its dict with extra_logs
    rewards = [1.0 if query[len(prompt):].strip() == label else 0.0 for query, prompt, label in zip(queries, prompts, labels)]
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"length": [float(len(q)) for q in queries]}}


async def own_timeout(prompt, completion, answer):  # its own client's timeout, not the run's
    raise TimeoutError("judge took too long")


async def blocks_the_loop(prompt, completion, answer):  # an async def calling blocking code (requests, time.sleep)
    import time

    time.sleep(0.45)
    return 1.0
