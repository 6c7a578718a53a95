"""Several weighted reward functions, called the TRL way or one sample at a time.

    task:
      reward_functions:
        - {function: "my_rewards:correct", weight: 1.0}              # per-sample
        - {function: "my_rewards:format_reward", weight: 0.2}        # batched (TRL), found by its signature
        - {function: "my_rewards:judge", weight: 0.5, batched: true, name: judge}

The reward of a sample is ``sum_i weight_i * r_i`` (TRL's ``reward_weights``); each function's
own mean is logged as ``reward/<name>/mean`` (``name``: the entry's ``name``, else the function's
``__name__``; a repeated name gets ``_2``, ``_3``...).

**Per-sample** functions are called as ``fn(prompt, completion, answer, **columns)``: the first
three positionally (``prompt`` is the row's prompt as written, a string or a list of chat
messages; ``completion`` the generated completion; ``answer`` the reference, a string), then
every other column of the data row by its own name, plus ``completion_ids`` (the generated token
ids). **Batched** functions get lists, all by keyword, exactly as TRL's ``GRPOTrainer`` calls a
reward function: ``fn(prompts=[...], completions=[...], completion_ids=[[...]], answer=[...],
answers=[...], **columns)`` and return a list of numbers, one per sample. So a TRL reward file
works unchanged. In both forms a completion has its prompt's shape, TRL's rule: the text for a
text prompt; ``[{"role": "assistant", "content": text}]`` for a chat prompt (list of messages), and with
``task.tools`` every turn: ``[{"role": "assistant", "content": ..., "tool_calls": [...]}, {"role": "tool", "name":
..., "content": result}, ..., {"role": "assistant", "content": answer}]``.

**verl's** ``compute_score`` works unchanged too: a function whose first parameter is
``data_source`` is called the way verl's ``NaiveRewardManager`` calls it, all by keyword:
``fn(data_source=..., solution_str=completion text, ground_truth=answer, extra_info=row's
extra_info or {})``; one whose first parameter is ``data_sources`` the way its
``BatchRewardManager`` does (``data_sources``, ``solution_strs``, ``ground_truths``,
``extra_infos``: lists). Other columns go along as keywords if it takes them. It may return a
number or verl's dict, whose ``"score"`` is the reward; its other numeric entries (verl's
``reward_extra_info``, e.g. ``acc``) are logged as ``reward/<name>/<key>``, the mean over the samples
that carry them (``Scored``). A data file in verl's layout keeps its answer in
``reward_model.ground_truth`` (``minirl.tasks.jsonl``).

**slime's** ``--custom-rm-path`` functions work unchanged as well: one whose first parameters are ``(args, sample)``
(or any two, with the entry's ``convention: slime``) is called per sample as slime's rollout calls it, an ``async
def``'s samples awaited together (``RewardFn.score_each``); ``(args, samples)`` (or the entry's ``batched``: slime's
``--group-rm``) once per prompt's group. ``sample`` is slime's ``Sample`` (``minirl.tasks.slime_types``: ``prompt``,
``response``, ``label`` as stored, ``metadata``, ``response_length``, ``tokens``, ``index``, ``group_index``,
``status``), ``args`` a ``SlimeArgs`` holding the entry's ``kwargs`` (the flags ``minirl config from-slime`` carries
over, and its ``--custom-config-path`` keys; None for any other). A dict it returns gives its ``reward_key`` entry
(``score`` by default).

**OpenRLHF's** ``--remote_rm_url reward_func.py`` works unchanged too: a function whose first parameters are
``(queries, prompts, labels)`` (or any, with the entry's ``convention: openrlhf``) is called batched, positionally, as
OpenRLHF calls it: ``fn(queries, prompts, labels)``; ``prompts`` the prompts as OpenRLHF hands them to vLLM (the text
as written, or with ``kwargs.apply_chat_template`` a chat rendered by the ``kwargs.tokenizer`` model's chat template
with the generation prompt), ``queries`` each prompt's and response's token ids decoded with their special tokens as
OpenRLHF 0.9 does (without a tokenizer or ids: the prompt's text followed by the response), ``labels`` the answers
(with ``kwargs.label_key``, that column as stored). It may return a tensor or list of rewards or OpenRLHF's dict:
``rewards`` is the reward, ``scores`` (what OpenRLHF's dynamic filtering reads) is not used, and each ``extra_logs``
entry, a number or one per sample, is logged as ``reward/<name>/<key>``. The entry's other ``kwargs`` go along as
keywords.

Both TRL forms also get ``trainer_state`` as TRL passes it (``trainer_state.global_step``: gradient
updates done, ``trainer_state.max_steps``: all of the run's, TRL's optimizer steps; ``trainer_state.epoch``: passes
over the training prompts, a float), for rewards
shaped by training progress. A batched TRL function also gets TRL's ``log_metric(name, value)`` (its mean
logged as ``reward/<name>/<metric>``) and ``log_extra(column, values)`` (one value per sample, written with
the samples to ``samples.jsonl``): ``TrlLogs``.

A function may return ``None`` for a sample it does not apply to (TRL's rule, e.g. one reward per
task in a mixed dataset): the sample's reward is then the weighted sum of the functions that did
apply, and the function's ``reward/<name>/mean`` is over the samples it scored. A sample none applied to has reward 0,
and with a group-mean or leave-one-out baseline (or GDPO's aggregation) it is out of its group's statistics with
advantage 0, as in TRL 1.16 (``minirl.algo.variants.scored``); other baselines train it at reward 0.

A function receives only the keywords it names, unless it takes ``**kwargs`` (then it gets all
of them). Whether a function is batched: the entry's ``batched`` flag; if absent, batched when
it has a parameter named ``prompts``, ``completions``, ``completion_ids`` or ``environments`` (TRL's convention: it
calls by keyword, so anywhere) or its first is ``data_sources`` (verl's), else per-sample. ``async def`` functions (or any that return an
awaitable) are awaited. One naming ``environments`` gets the rollouts' instances (``task.environment``; TRL's
``environments=``) and runs in the trainer's process; so does a batched one taking ``**kwargs`` when the rollouts have
environments (TRL passes them to every reward function).

Like ``minirl.tasks.rewards`` this imports nothing heavy: the reward worker process uses it.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import inspect
import math
import numbers
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minirl.tasks.rewards import (
    RewardFunctionError,
    RewardSpecError,
    check_reward_value,
    function_name,
    load_reward_function,
    raised_message,
    reward_spec,
)

if TYPE_CHECKING:
    from minirl.types import Prompt

TRL_BATCHED_PARAMETERS = frozenset({"prompts", "completions", "completion_ids", "environments"})
"""A reward function naming one of these (anywhere: TRL calls by keyword) is called batched, TRL's way."""
VERL_FIRST_PARAMETERS = ("data_source", "data_sources")
OPENRLHF_PARAMETERS = ["queries", "prompts", "labels"]
"""OpenRLHF's ``reward_func(queries, prompts, labels)``: TRL never passes ``queries``, so these names are OpenRLHF's."""


class Scored(float):
    """A reward (the float itself) with the other numbers a verl ``compute_score`` dict carried, or a TRL
    function's ``log_metric`` calls (``extras``: key -> number, logged as ``reward/<name>/<key>``), and the
    completions-table columns its ``log_extra`` calls gave this sample (``columns``, written to ``samples.jsonl``).
    Arithmetic sees only the float."""

    extras: dict[str, float]
    columns: dict[str, Any]

    def __new__(cls, reward: float, extras: dict[str, float], columns: dict[str, Any] | None = None) -> Scored:
        scored = super().__new__(cls, reward)
        scored.extras = extras
        scored.columns = dict(columns or {})
        return scored

    def __reduce__(self) -> tuple[Any, ...]:  # sent back from the reward worker
        return (Scored, (float(self), self.extras, self.columns))


class TrlLogs:
    """TRL's ``log_metric(name, value)`` and ``log_extra(column, values)`` keywords of one batched call (TRL 1.16's
    ``GRPOTrainer._calculate_rewards``): the metric's mean is logged as ``reward/<function>/<name>``; the column's
    values (one per sample) go with the samples to ``samples.jsonl``."""

    def __init__(self) -> None:
        self.metrics: dict[str, list[float]] = {}
        self.columns: dict[str, list[Any]] = {}

    def log_metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(str(name), []).append(float(value))

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.columns.setdefault(str(column), []).extend(list(values))

    def attach(self, values: list[float | None]) -> list[float | None]:
        """``values`` carrying what was logged (a sample that got ``None`` carries nothing)."""
        if not (self.metrics or self.columns):
            return values
        means = {name: sum(v) / len(v) for name, v in self.metrics.items()}
        out: list[float | None] = []
        for index, value in enumerate(values):
            if value is None:
                out.append(None)
                continue
            columns = {name: column[index] for name, column in self.columns.items() if index < len(column)}
            extras = {**getattr(value, "extras", {}), **means}
            out.append(Scored(float(value), extras, {**getattr(value, "columns", {}), **columns}))
        return out


@dataclass(frozen=True)
class TrainerState:
    """Training progress, as the fields of transformers' ``TrainerState`` that TRL reward functions read."""

    global_step: int = 0
    """Gradient updates done before these completions were scored (TRL's optimizer steps)."""
    max_steps: int = 0
    """Gradient updates of the whole run (``optim.global_steps`` x ``minibatches_per_step`` x ``epochs_per_step``)."""
    epoch: float = 0.0
    """Passes over the training prompts before these completions were scored, a fraction within one (transformers'
    ``state.epoch``: global steps done x ``rollout.prompts_per_step`` / training prompts)."""


@dataclass
class Sample:
    """What a reward function may see of one sample (picklable: sent to the worker process)."""

    prompt: Any  # str, or a list of chat messages
    completion: str
    answer: str
    completion_ids: list[int] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    trainer_state: TrainerState | None = None
    messages: list[dict[str, Any]] | None = None  # ``task.tools``: the completion as chat messages, calls and results
    environment: Any = None  # ``task.environment``: the rollout's instance, for functions taking ``environments``
    prompt_ids: list[int] = field(default_factory=list)  # the prompt's token ids (slime's ``Sample.tokens`` begin so)
    index: int = 0  # its place among the samples scored together (slime's ``Sample.index``)
    group_index: int = 0  # its prompt's place among them: a group's samples share it (slime's ``group_index``)
    truncated: bool = False  # cut at the response budget (finish ``length``; slime's ``Status.TRUNCATED``)

    def __getstate__(self) -> dict[str, Any]:  # sent to a worker without its environment (scored here: not needed)
        return {**self.__dict__, "environment": None}


def sample_of(prompt: Prompt, completion: str, completion_ids: Sequence[int] = (),
              trainer_state: TrainerState | None = None, messages: list[dict[str, Any]] | None = None,
              environment_reward: float | None = None, tool_extra_fields: dict[str, Any] | None = None,
              environment: Any = None, **place: Any) -> Sample:
    """The ``Sample`` of ``completion`` to ``prompt``: its columns are ``meta`` less ``source``; ``messages``: the
    completion's chat messages when it called tools (``Completion.messages``); ``environment_reward``: its
    environment's score (``task.environment``), and ``tool_extra_fields``: verl's tools' (``task.tool_config``), one
    more column each; ``environment``: the rollout's instance (``Sample.environment``); ``place``: ``prompt_ids``,
    ``index``, ``group_index`` and ``truncated`` (``Sample``'s)."""
    columns = {key: value for key, value in (getattr(prompt, "meta", None) or {}).items() if key != "source"}
    if environment_reward is not None:
        columns["environment_reward"] = environment_reward
    if tool_extra_fields is not None:
        columns["tool_extra_fields"] = tool_extra_fields
    prompt_messages = getattr(prompt, "messages", None)
    shown = prompt_messages if prompt_messages is not None else prompt.text
    return Sample(shown, completion, prompt.answer, list(completion_ids), columns, trainer_state, messages, environment,
                  **place)


@dataclass
class RewardFn:
    """One configured reward function and how to call it."""

    fn: Callable[..., Any]
    weight: float = 1.0
    batched: bool = False
    name: str = ""
    spec: str | None = None
    """How a worker process imports it again (``None``: it is sent pickled, or cannot be)."""
    verl: bool = False
    """Called with verl's keywords (``data_source``, ``solution_str``, ``ground_truth``, ``extra_info``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Fixed keyword arguments of every call (verl's ``custom_reward_function.reward_kwargs``, TRL's ``partial``); for a
    slime function, the attributes of its ``args``."""
    slime: bool = False
    """Called as slime calls ``--custom-rm-path``: ``fn(args, sample)`` (``fn(args, samples)`` batched)."""
    key: str | None = None
    """The entry of a returned dict that is this reward (verl's GDPO reward keys); ``None``: ``score`` for verl's
    dicts, slime's ``reward_key``."""
    openrlhf: bool = False
    """Called as OpenRLHF calls ``--remote_rm_url reward_func.py``: ``fn(queries, prompts, labels)``, batched."""

    def __post_init__(self) -> None:
        self.name = self.name or getattr(self.fn, "__name__", None) or type(self.fn).__name__
        self.full_name = function_name(self.fn)
        self._accepts = _accepted_keywords(self.fn)
        self._given_first = _first_three(self.fn)  # a column named like them (an "answer" kept as stored) is not a keyword
        self.takes_environments = _names_parameter(self.fn, "environments")  # TRL's: scored where the instances are
        self.takes_any_keyword = self._accepts is None  # **kwargs: gets environments too, as TRL passes them to all
        given = set(self.kwargs) - ({"tokenizer", "apply_chat_template", "label_key"} if self.openrlhf else set())
        unknown = sorted(given - self._accepts) if self._accepts is not None and not self.slime else []
        if unknown:
            raise RewardSpecError(f"reward function {self.full_name} takes no keyword {unknown[0]!r} (its kwargs)")

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "weight": self.weight, "batched": self.batched, "name": self.name, "spec": self.spec,
                "verl": self.verl, "kwargs": self.kwargs, "slime": self.slime, "key": self.key, "openrlhf": self.openrlhf}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def keywords(self, available: dict[str, Any]) -> dict[str, Any]:
        """What a call passes by keyword: the ``available`` ones the function takes, then its fixed ``kwargs``."""
        taken = dict(available) if self._accepts is None else {k: v for k, v in available.items() if k in self._accepts}
        return {**taken, **self.kwargs}

    def score(self, samples: Sequence[Sample]) -> list[float | None]:
        """Rewards of ``samples`` (finite floats, or ``None`` where the function does not apply, TRL's
        rule), or ``RewardFunctionError`` naming the function."""
        if self.batched:
            return self._score_batch(samples)
        return [self._score_one(sample) for sample in samples]

    def _score_one(self, sample: Sample) -> float | None:
        try:
            value = resolve(self._call(sample))
        except Exception as error:
            raise RewardFunctionError(raised_message(self.full_name, error)) from error
        return self._checked(value)

    def _call(self, sample: Sample) -> Any:
        """The per-sample call, as the function's convention makes it (an awaitable for an ``async def``)."""
        if self.slime:
            return self.fn(SlimeArgs(self.kwargs), slime_sample(sample, self.kwargs))
        if self.verl:
            return self.fn(**self.keywords(verl_keywords(sample)))
        columns = {key: value for key, value in sample.columns.items() if key not in self._given_first}
        kwargs = self.keywords({**columns, "completion_ids": sample.completion_ids, **_progress(sample.trainer_state)})
        return self.fn(sample.prompt, shaped_completion(sample), sample.answer, **kwargs)

    @property
    def awaited(self) -> bool:
        """A per-sample ``async def``: ``score_each`` awaits its samples' calls together."""
        call = type(self.fn).__call__ if not inspect.isroutine(self.fn) else None  # an object whose __call__ is async
        return not self.batched and (inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(call))

    def score_each(self, samples: Sequence[Sample], timeout_s: float | None = None) -> list[tuple[str, Any]]:
        """``("ok", reward)`` or ``("error", message)`` per sample, every sample's call awaited together (slime's
        rollout awaits a task per sample; a reward that waits on a server or a judge takes one wait, not n);
        ``("timeout", message)`` for a call still awaiting after ``timeout_s`` (a reward worker's)."""

        async def one(sample: Sample) -> tuple[str, Any]:
            try:
                value = self._call(sample)
                if inspect.isawaitable(value) and timeout_s is not None:  # the function's own TimeoutError is an error
                    task = asyncio.ensure_future(value)
                    done, _ = await asyncio.wait({task}, timeout=timeout_s)
                    if not done:
                        task.cancel()
                        return "timeout", (f"reward function {self.full_name} did not return within {timeout_s:g} s "
                                           "(task.reward_timeout_s)")
                    value = task
                return "ok", self._checked(await value if inspect.isawaitable(value) else value)
            except RewardFunctionError as error:
                return "error", str(error)
            except Exception as error:
                return "error", raised_message(self.full_name, error)

        async def every() -> list[tuple[str, Any]]:
            return list(await asyncio.gather(*(one(sample) for sample in samples)))

        return list(resolve(every()))

    def _checked(self, value: Any) -> float | None:
        """``value`` as a finite float; ``None`` as ``None`` (TRL: this function does not apply to this
        sample); verl's ``{"score": reward, ...}`` as a ``Scored`` reward."""
        if value is None:
            return None
        key = "score"
        if self.key is not None and isinstance(value, dict):  # the entry's key (verl's GDPO reward keys)
            key = self.key
            if key not in value:
                raise RewardFunctionError(f"reward function {self.full_name} returned a dict without {key!r} (the "
                                          f"entry's key; keys: {', '.join(map(str, value))})")
        elif self.slime and isinstance(value, dict):  # slime's Sample.get_reward_value: reward[args.reward_key]
            key = self.kwargs.get("reward_key") or "score"
            if key not in value:
                which = ("slime's --reward-key" if self.kwargs.get("reward_key") else
                         "no --reward-key names the entry that is the reward; minirl reads 'score' then")
                raise RewardFunctionError(f"reward function {self.full_name} returned a dict without {key!r} ({which}; "
                                          f"keys: {', '.join(map(str, value))})")
        elif not (self.verl and isinstance(value, dict)):
            return check_reward_value(value, self.full_name)
        elif "score" not in value:
            raise RewardFunctionError(f"reward function {self.full_name} returned a dict without \"score\" "
                                      f"(keys: {', '.join(map(str, value))}); verl's convention puts the reward there")
        extras = {str(name): float(number) for name, number in value.items()  # logged beside it (e.g. acc)
                  if name != key and isinstance(number, numbers.Real) and math.isfinite(number)}
        reward = check_reward_value(value[key], self.full_name)
        return Scored(reward, extras) if extras else reward

    def _score_batch(self, samples: Sequence[Sample]) -> list[float | None]:
        if self.openrlhf:
            return self._score_openrlhf(samples)
        available = batch_keywords(samples)
        logs = TrlLogs()
        if self.verl:
            available |= {f"{key}s": [verl_keywords(s)[key] for s in samples] for key in VERL_KEYWORDS}
        else:
            available |= {"log_metric": logs.log_metric, "log_extra": logs.log_extra}
        try:
            if self.slime:  # slime's --group-rm: one call per prompt's group, the groups awaited together
                groups = [[n for n, s in enumerate(samples) if s.group_index == g]
                          for g in dict.fromkeys(s.group_index for s in samples)]
                args = SlimeArgs(self.kwargs)
                parts = together([self.fn(args, [slime_sample(samples[n], self.kwargs) for n in group]) for group in groups])
                values = [None] * len(samples)
                for group, part in zip(groups, parts):
                    for n, value in zip(group, self._listed(part, group)):
                        values[n] = value
            else:
                values = resolve(self.fn(**self.keywords(available)))
        except RewardFunctionError:
            raise
        except Exception as error:
            raise RewardFunctionError(raised_message(self.full_name, error)) from error
        return logs.attach([self._checked(value) for value in self._listed(values, samples)])

    def _score_openrlhf(self, samples: Sequence[Sample]) -> list[float | None]:
        """OpenRLHF's call, ``fn(queries, prompts, labels)``, and its tensor, list or ``{"rewards", "scores",
        "extra_logs"}`` dict (``extra_logs``: a number, or one per sample, each logged as ``reward/<name>/<key>``)."""
        kwargs = dict(self.kwargs)
        tokenizer = kwargs.pop("tokenizer", None)  # the model's: decodes the queries (and renders chats)
        chat = kwargs.pop("apply_chat_template", tokenizer is not None)  # --apply_chat_template
        label_key = kwargs.pop("label_key", None)
        prompts = [openrlhf_prompt(sample, tokenizer if chat else None) for sample in samples]
        queries = [openrlhf_query(sample, prompt, tokenizer) for prompt, sample in zip(prompts, samples)]
        labels = [openrlhf_label(sample, label_key) for sample in samples]
        try:
            value = resolve(self.fn(queries, prompts, labels, **kwargs))
        except Exception as error:
            raise RewardFunctionError(raised_message(self.full_name, error)) from error
        logs: dict[str, Any] = {}
        if isinstance(value, dict):
            if "rewards" not in value:
                raise RewardFunctionError(f"reward function {self.full_name} returned a dict without 'rewards' (OpenRLHF's "
                                          f"convention puts the rewards there; keys: {', '.join(map(str, value))})")
            logs = dict(value.get("extra_logs") or {})
            value = value["rewards"]
        rewards = [check_reward_value(v, self.full_name) for v in self._listed(value, samples)]
        extras: list[dict[str, float]] = [{} for _ in samples]
        for name, logged in logs.items():
            logged = logged.tolist() if hasattr(logged, "tolist") else logged
            each = logged if isinstance(logged, (list, tuple)) and len(logged) == len(samples) else [logged] * len(samples)
            for extra, number in zip(extras, each):
                if isinstance(number, numbers.Real) and math.isfinite(number):
                    extra[str(name)] = float(number)
        return [Scored(reward, extra) if extra else reward for reward, extra in zip(rewards, extras)]

    def _listed(self, values: Any, samples: Sequence[Any]) -> Sequence[Any]:
        """A batched call's ``values``, checked to be one per sample (an array or tensor, as TRL takes it, as a list)."""
        if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):  # numpy's ndarray, torch's Tensor
            values = values.tolist()
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise RewardFunctionError(
                f"reward function {self.full_name} is batched and returned {type(values).__name__} {values!r:.60}, "
                f"expected a list of {len(samples)} numbers"
            )
        if len(values) != len(samples):
            raise RewardFunctionError(
                f"reward function {self.full_name} returned {len(values)} rewards for {len(samples)} completions"
            )
        return values


VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")


def verl_keywords(sample: Sample) -> dict[str, Any]:
    """What verl's reward managers pass for one sample (plus the row's columns and the token ids). The
    ground truth is the row's ``reward_model.ground_truth`` as stored (a number, list or object stays one),
    else the answer column's text; verl's tools' ``tool_extra_fields`` (``task.tool_config``) are merged into
    ``extra_info``, and its ``num_turns`` and ``rollout_reward_scores`` (none here) set, as verl's reward managers do."""
    extra_info = sample.columns.get("extra_info")
    extra_info = {**(extra_info if isinstance(extra_info, dict) else {}), **(sample.columns.get("tool_extra_fields") or {}),
                  "num_turns": verl_num_turns(sample.messages), "rollout_reward_scores": {}}
    reward_model = sample.columns.get("reward_model")
    stored = isinstance(reward_model, dict) and "ground_truth" in reward_model
    return {**sample.columns, "completion_ids": list(sample.completion_ids),
            "data_source": sample.columns.get("data_source"), "solution_str": sample.completion,
            "ground_truth": reward_model["ground_truth"] if stored else sample.answer,  # type: ignore[index]
            "extra_info": extra_info}


def verl_num_turns(messages: list[dict[str, Any]] | None) -> int:
    """verl's ``num_turns`` of a response: the prompt's turn, each model turn and each round of tool results (its tool
    agent's ``user_turns + assistant_turns + 1``; 2 for a plain response, as its single-turn agent says)."""
    if not messages:
        return 2
    roles = [message.get("role") for message in messages]
    rounds = sum(role == "tool" and (index == 0 or roles[index - 1] != "tool") for index, role in enumerate(roles))
    return 1 + roles.count("assistant") + rounds


class SlimeArgs(argparse.Namespace):
    """slime's ``args`` for a reward function: the entry's ``kwargs`` as attributes (what ``minirl config from-slime``
    carries over: ``hf_checkpoint``, ``reward_key``, ``rm_type``, ...); an attribute not given is None, as an unset
    slime flag."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(**values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def slime_sample(sample: Sample, args: dict[str, Any]) -> Any:
    """slime's ``Sample`` of ``sample`` (``minirl.tasks.slime_types``): its ``label`` is the ``label_key`` column as
    stored (slime's ``data[label_key]``; else the answer column's text, None for none), ``tokens`` the prompt's and
    the response's ids."""
    from minirl.tasks.slime_types import Sample as SlimeSample

    metadata = sample.columns.get(args.get("metadata_key") or "metadata")
    label_key = args.get("label_key")
    label = sample.columns.get(label_key, sample.answer) if label_key else sample.answer or None
    return SlimeSample(group_index=sample.group_index, index=sample.index, prompt=sample.prompt,
                       tokens=[*sample.prompt_ids, *sample.completion_ids], response=sample.completion,
                       response_length=len(sample.completion_ids), label=label,
                       status=SlimeSample.Status.TRUNCATED if sample.truncated else SlimeSample.Status.COMPLETED,
                       metadata=dict(metadata) if isinstance(metadata, dict) else {})


_TOKENIZERS: dict[str, Any] = {}


def openrlhf_prompt(sample: Sample, tokenizer: str | None = None) -> str:
    """The prompt as OpenRLHF hands it to vLLM (and to ``reward_func`` in its ``queries``): the text as written, or
    with ``tokenizer`` (a model directory: ``--apply_chat_template``) the chat (a text prompt as one user message)
    rendered by its chat template with the generation prompt. A chat without one: its contents, one per line."""
    if tokenizer is None:
        if isinstance(sample.prompt, list):
            return "\n".join(str(message.get("content", "")) for message in sample.prompt)
        return str(sample.prompt)
    chat = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": str(sample.prompt)}]
    return str(_tokenizer(tokenizer).apply_chat_template(chat, tokenize=False, add_generation_prompt=True))


def openrlhf_query(sample: Sample, prompt: str, tokenizer: str | None = None) -> str:
    """OpenRLHF 0.9's query: the prompt's and the response's token ids decoded with their special tokens
    (``decode(..., skip_special_tokens=False)``: the template's markers, the EOS that ended it), when the ``tokenizer``
    and the ids are known; else the prompt's text followed by the response's."""
    if tokenizer is None or not sample.prompt_ids or not sample.completion_ids:
        return prompt + sample.completion
    return str(_tokenizer(tokenizer).decode([*sample.prompt_ids, *sample.completion_ids], skip_special_tokens=False))


def _tokenizer(path: str) -> Any:
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer

        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
    return _TOKENIZERS[path]


def openrlhf_label(sample: Sample, label_key: str | None) -> Any:
    """The ``label_key`` column as stored (OpenRLHF's ``data[label_key]``: a number stays one, a list or an object
    too; the entry's ``kwargs.label_key``, which from-openrlhf writes), else the answer's text."""
    return sample.columns[label_key] if label_key and label_key in sample.columns else sample.answer


def looks_openrlhf(fn: Callable[..., Any]) -> bool:
    """OpenRLHF's ``reward_func(queries, prompts, labels, **kwargs)``."""
    return _positional(_parameters(fn) or [])[:3] == OPENRLHF_PARAMETERS


def looks_slime(fn: Callable[..., Any]) -> bool:
    """slime's ``--custom-rm-path`` convention: ``(args, sample, **kwargs)`` or ``(args, samples, **kwargs)``."""
    return [p.name for p in _parameters(fn) or []][:2] in (["args", "sample"], ["args", "samples"])


def environment_reward(prompt: Any, completion: Any, answer: Any, environment_reward: float | None = None,
                       environment: str | None = None, class_environments: list[str] | None = None,
                       **columns: Any) -> float | None:
    """The reward a rollout's environment gave it (``get_reward()``, ``task.environment``; TRL's environment reward
    source); None (does not apply) for a rollout whose environment defines none or, with ``class_environments`` (the
    names of one class's environments, ``task.environment`` as a dict), runs in another (the row's ``environment``)."""
    if class_environments is not None and environment not in class_environments:
        return None
    return environment_reward


def batch_keywords(samples: Sequence[Sample]) -> dict[str, Any]:
    """The keyword arguments of a batched call: TRL's names, the answers, and every column."""
    completions = [shaped_completion(s) for s in samples]
    columns: dict[str, list[Any]] = {}
    for index, sample in enumerate(samples):
        for key, value in sample.columns.items():
            columns.setdefault(key, [None] * len(samples))[index] = value
    answers = [s.answer for s in samples]
    if any(s.environment is not None for s in samples):  # TRL's environments=: the rollouts' instances
        columns["environments"] = [s.environment for s in samples]
    # the dataset's own columns win over minirl's answer / answers lists (a SQuAD-style "answers" column stays its own)
    return {"answer": answers, "answers": answers, **columns, "prompts": [s.prompt for s in samples],
            "completions": completions, "completion_ids": [list(s.completion_ids) for s in samples],
            **_progress(samples[0].trainer_state if samples else None)}


def _progress(state: TrainerState | None) -> dict[str, TrainerState]:
    """TRL's ``trainer_state`` keyword, when the caller knows the training progress."""
    return {} if state is None else {"trainer_state": state}


def shaped_completion(sample: Sample) -> Any:
    """The completion in its prompt's shape (TRL): text, or for a chat prompt its messages: one assistant message, or
    with ``task.tools`` each assistant turn (with its ``tool_calls``) and each tool's result, in order."""
    if not isinstance(sample.prompt, list):
        return sample.completion
    return sample.messages if sample.messages is not None else [{"role": "assistant", "content": sample.completion}]


_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None  # (the process it runs in, the loop)
_LOOP_LOCK = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for awaited reward functions and tools, running in a daemon thread: the same loop at
    every call, so what they bind to a loop (an ``asyncio.Semaphore``, an aiohttp session) stays usable, as TRL's
    async reward functions share one loop. A forked process starts its own."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid() or _LOOP[1].is_closed() or not _LOOP[1].is_running():
            loop, running = asyncio.new_event_loop(), threading.Event()
            loop.call_soon(running.set)
            threading.Thread(target=loop.run_forever, name="minirl event loop", daemon=True).start()
            running.wait()  # is_running() from here on (a loop that died, e.g. of a SystemExit, is replaced)
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


def together(values: list[Any]) -> list[Any]:
    """``values`` with the awaitable ones awaited concurrently on ``background_loop`` (slime's rollout: a task per
    sample or group); an exception raised by one is raised here."""
    if not any(inspect.isawaitable(value) for value in values):
        return values

    async def one(value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    async def every() -> list[Any]:
        return list(await asyncio.gather(*(one(value) for value in values)))

    return list(resolve(every()))


def resolve(value: Any) -> Any:
    """``value``, awaited when it is awaitable (an ``async def`` reward function), on ``background_loop``."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> tuple[bool, Any]:
        try:
            return True, await value
        except (SystemExit, KeyboardInterrupt) as error:  # raised here, in the caller's thread: on the loop they stop it
            return False, error

    done, result = asyncio.run_coroutine_threadsafe(wait(), background_loop()).result()
    if not done:
        raise result
    return result


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """``fn``'s parameters, or None when it has no signature to read (a builtin, an opaque callable)."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def _positional(parameters: list[inspect.Parameter]) -> list[str]:
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _first_three(fn: Callable[..., Any]) -> frozenset[str]:
    """The names of ``fn``'s first three positional parameters: a per-sample call passes prompt, completion and answer
    in them, so no column may be passed again by those names."""
    parameters = _parameters(fn)
    return frozenset({"prompt", "completion", "answer"} if parameters is None else _positional(parameters)[:3])


def _accepted_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Parameter names ``fn`` takes by keyword; ``None`` when it takes ``**kwargs`` (or is opaque)."""
    parameters = _parameters(fn)
    if parameters is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _names_parameter(fn: Callable[..., Any], name: str) -> bool:
    """``fn`` has a parameter of this name (not only ``**kwargs``)."""
    return any(p.name == name for p in _parameters(fn) or [])


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    parameters = _parameters(fn)
    return parameters[0].name if parameters else None


def looks_batched(fn: Callable[..., Any]) -> bool:
    """TRL's convention (a parameter named ``prompts``, ``completions``, ``completion_ids`` or ``environments``,
    wherever it is: TRL calls every reward function by keyword; or keyword arguments alone, which only TRL's keyword
    call can fill) or verl's batched one (the first parameter ``data_sources``)."""
    parameters = _parameters(fn) or []
    keywords_only = bool(parameters) and all(p.kind in (p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in parameters)
    return (_first_parameter(fn) == "data_sources" or bool({p.name for p in parameters} & TRL_BATCHED_PARAMETERS)
            or keywords_only)


def looks_verl(fn: Callable[..., Any]) -> bool:
    """verl's ``compute_score`` convention: the first parameter is ``data_source`` (or ``data_sources``)."""
    return _first_parameter(fn) in VERL_FIRST_PARAMETERS


def make_reward_fn(
    target: str | Callable[..., Any], weight: float = 1.0, batched: bool | None = None, name: str | None = None,
    kwargs: dict[str, Any] | None = None, key: str | None = None, convention: str = "auto",
) -> RewardFn:
    """A ``RewardFn`` from a ``module:function`` spec (or a callable); ``key``: the entry of its returned dict;
    ``convention`` "slime" / "openrlhf": called as slime / OpenRLHF calls it, whatever its parameters are named."""
    fn = load_reward_function(target) if isinstance(target, str) else target
    if not callable(fn):
        raise RewardSpecError(f"reward function {target!r} is not callable")
    spec = target if isinstance(target, str) else reward_spec(fn)
    if convention == "openrlhf" or (convention == "auto" and looks_openrlhf(fn)):  # always batched, as OpenRLHF calls it
        if batched is False:
            raise RewardSpecError(f"reward function {function_name(fn)}: OpenRLHF's reward_func(queries, prompts, labels) "
                                  "is called with lists; leave 'batched' out")
        return RewardFn(fn, float(weight), True, name or "", spec, kwargs=dict(kwargs or {}), key=key, openrlhf=True)
    if convention == "slime" or looks_slime(fn):  # batched when the entry says so (--group-rm) or it takes ``samples``
        group = [p.name for p in _parameters(fn) or []][1:2] == ["samples"]
        return RewardFn(fn, float(weight), group if batched is None else bool(batched), name or "", spec,
                        kwargs=dict(kwargs or {}), slime=True, key=key)
    verl = looks_verl(fn)
    if verl and batched is not None and batched != looks_batched(fn):
        raise RewardSpecError(f"reward function {function_name(fn)}: batched={batched} does not fit verl's signature "
                              f"(first parameter {_first_parameter(fn)!r}: "
                              f"{'batched' if looks_batched(fn) else 'per-sample'}); leave 'batched' out")
    batched = looks_batched(fn) if batched is None or verl else bool(batched)
    if not batched and not verl:
        _check_per_sample(fn)
    return RewardFn(fn, float(weight), batched, name or "", spec, verl, dict(kwargs or {}), key=key)


def _check_per_sample(fn: Callable[..., Any]) -> None:
    """A function called per sample, ``fn(prompt, completion, answer, ...)``, takes three positional arguments; one
    that cannot fits neither that nor TRL's batched call: one line now (naming the TRL keyword it comes close to),
    not a ``TypeError`` at the first step."""
    parameters = _parameters(fn)
    if parameters is None or any(p.kind == p.VAR_POSITIONAL for p in parameters) or len(_positional(parameters)) >= 3:
        return
    names = [p.name for p in parameters]
    close = [match for name in names for match in difflib.get_close_matches(name, ("prompts", "completions",
                                                                                  "completion_ids"), n=1, cutoff=0.8)]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise RewardSpecError(f"reward function {function_name(fn)}: its parameters ({', '.join(names)}) fit neither TRL's "
                          "batched call (a parameter prompts, completions or completion_ids) nor the per-sample "
                          f"fn(prompt, completion, answer, ...){hint}")


def unique_names(functions: list[RewardFn]) -> None:
    """Give repeated names a suffix (``score``, ``score_2``), so each has its own metric."""
    seen: dict[str, int] = {}
    for entry in functions:
        count = seen.get(entry.name, 0) + 1
        seen[entry.name] = count
        if count > 1:
            entry.name = f"{entry.name}_{count}"
