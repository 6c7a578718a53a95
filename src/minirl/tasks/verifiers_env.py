"""A ``verifiers`` environment (prime-rl's environments) as minirl data and a reward function.

    task:
      kind: jsonl
      path: verifiers:reverse-text                       # the env's dataset; args: verifiers:ID {"key": value}
      reward_functions:
        - {function: minirl.tasks.verifiers_env:rubric, name: reverse-text,
           kwargs: {env: reverse-text, env_args: {}}}

``verifiers:ENV_ID`` (optionally followed by the ``load_environment`` arguments as a JSON object,
``verifiers:ENV_ID {"num_train_examples": 100}``) as a ``task.path`` reads the rows of
``vf.load_environment(ENV_ID, **args)``'s ``dataset`` (``task.eval_split: eval``: its ``eval_dataset``, which is also
the default held-out set when the environment has one and neither ``task.eval_path`` nor ``task.eval_split`` is
given). A row keeps the environment's columns: ``prompt`` (chat messages; a ``question`` column becomes them with the
env's ``system_prompt`` and ``few_shot`` first, as verifiers' ``format_dataset`` does), ``answer``, ``info``,
``task``, ``example_id``.

``rubric`` scores each completion with the environment's ``Rubric`` (a ``RubricGroup``'s rubrics in turn): every reward
function is called as verifiers calls it, by keyword, with those of ``prompt``, ``completion``, ``answer``, ``state``,
``info``, ``task``, ``example_id``, the rubric's class objects (``parser``, ...) and the row's other columns that it
names (all, with ``**kwargs``); a group function (one naming ``prompts``, ``completions``, ``answers``, ``states``,
``tasks`` or ``infos``) once per prompt's samples in the call. ``async def`` functions are awaited together. The reward
is ``sum(weight * value)``; each function's mean is logged as ``reward/<entry name>/<function name>`` (TRL's
``log_metric``, a value a sample). A function that raises stops the step with its name (verifiers logs it and scores 0); one of weight 0 (a
metric, such as ``num_turns``) that raises is left out of the logs.

Only single-turn environments (``vf.SingleTurnEnv``) train here: minirl samples one completion per prompt. The
environment is loaded once per process (cached by id and arguments), in a reward worker too. verifiers' environments
install SIGINT / SIGTERM handlers when built; minirl's own stay. Checked against verifiers 0.1.14 and 0.3.1 (the
classic API; 0.3's ``verifiers.legacy``); 0.4.0 keeps only its v1 API, which has no ``load_environment``.

Imports nothing heavy (the reward worker imports it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

PREFIX = "verifiers:"
GROUP_PARAMETERS = frozenset({"states", "prompts", "completions", "answers", "tasks", "infos"})
"""verifiers' ``Rubric._is_group_func``: a reward function naming one of these scores a group at once."""
EVAL_SPLITS = ("eval", "test", "validation")

_ENVS: dict[tuple[int, str, str], Any] = {}
_LOCK = threading.Lock()


class VerifiersError(Exception):
    """A verifiers environment that cannot be used here; ``str()`` is one line naming it."""


def is_spec(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``verifiers:ENV_ID`` or ``verifiers:ENV_ID {json args}`` -> (id, args)."""
    rest = spec[len(PREFIX):].strip()
    env_id, brace, args_text = rest.partition("{")
    env_id = env_id.strip()
    if not env_id:
        raise VerifiersError(f"{spec!r}: no environment id after 'verifiers:' (e.g. verifiers:reverse-text)")
    args: Any = {}
    if brace:
        try:
            args = json.loads(brace + args_text)
        except json.JSONDecodeError as error:
            raise VerifiersError(f"{spec!r}: the arguments after {env_id!r} are not a JSON object ({error.msg})") from None
        if not isinstance(args, dict):
            raise VerifiersError(f"{spec!r}: the arguments after {env_id!r} are not a JSON object")
    return env_id, args


def spec_of(env_id: str, env_args: dict[str, Any] | None = None) -> str:
    """The ``task.path`` of an environment and its arguments."""
    return PREFIX + env_id + (" " + json.dumps(env_args, sort_keys=True) if env_args else "")


def load(env_id: str, env_args: dict[str, Any] | None = None) -> Any:
    """``vf.load_environment(env_id, **env_args)``, once per process; a single-turn one, or ``VerifiersError``."""
    key = (os.getpid(), env_id, json.dumps(env_args or {}, sort_keys=True, default=repr))
    with _LOCK:
        if key not in _ENVS:
            _ENVS[key] = _checked(env_id, _load(env_id, dict(env_args or {})))
        return _ENVS[key]


def _load(env_id: str, env_args: dict[str, Any]) -> Any:
    try:
        import verifiers
    except ImportError:
        raise VerifiersError(f"verifiers environment {env_id!r}: the verifiers package is not installed "
                             "(pip install 'verifiers<0.4' and the environment's package)") from None
    loader = getattr(verifiers, "load_environment", None)
    if loader is None:
        version = getattr(verifiers, "__version__", "?")
        raise VerifiersError(f"verifiers environment {env_id!r}: verifiers {version} has no load_environment (0.4 keeps "
                             "only its v1 API); minirl reads the classic environments: pip install 'verifiers<0.4'")
    installer = signal.signal
    signal.signal = lambda signum, handler: signal.getsignal(signum)  # type: ignore[assignment]
    try:  # verifiers' Environment sets SIGINT / SIGTERM handlers (and raises off the main thread): minirl's stay
        return loader(env_id, **env_args)
    except Exception as error:
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise VerifiersError(f"verifiers environment {env_id!r} (args {env_args}): {reason}") from None
    finally:
        signal.signal = installer


def _checked(env_id: str, env: Any) -> Any:
    classes = [cls.__name__ for cls in type(env).__mro__]
    if "SingleTurnEnv" not in classes:
        raise VerifiersError(f"verifiers environment {env_id!r} is a {type(env).__name__}, a multi-turn environment; "
                             "minirl trains single-turn ones (vf.SingleTurnEnv) only")
    return env


# ------------------------------------------------------------------ data


def _dataset(env: Any, which: str) -> Any:
    """The env's ``dataset`` / ``eval_dataset``, built when the env builds it lazily (verifiers >= 0.1.10)."""
    build = getattr(env, f"build_{which}", None)
    if callable(build):
        built = build()
        if built is not None:
            return built
    return getattr(env, which, None)


def has_eval(spec: str) -> bool:
    env_id, args = parse_spec(spec)
    return _dataset(load(env_id, args), "eval_dataset") is not None


def iter_env_rows(spec: str, split: str = "train") -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of the environment's ``dataset`` (``split`` train) or ``eval_dataset`` (eval / test /
    validation), as ``minirl.tasks.data.iter_rows`` yields a file's."""
    env_id, args = parse_spec(spec)
    env = load(env_id, args)
    if split != "train" and split not in EVAL_SPLITS:
        raise VerifiersError(f"{spec}: a verifiers environment has the splits train and eval (got {split!r})")
    which = "dataset" if split == "train" else "eval_dataset"
    dataset = _dataset(env, which)
    if dataset is None:
        raise VerifiersError(f"verifiers environment {env_id!r} has no {which}")
    where = f"{PREFIX}{env_id}" + ("" if split == "train" else "[eval]")
    for index, row in enumerate(dataset, start=1):
        yield f"{where}:row {index}", _formatted(env, dict(row))


def _formatted(env: Any, row: dict[str, Any]) -> dict[str, Any]:
    """A row with its ``prompt`` as chat messages: a ``question`` becomes the user's message after the env's
    ``system_prompt`` and ``few_shot`` (verifiers' ``format_dataset``)."""
    if "prompt" in row or "question" not in row:
        return row
    system = getattr(env, "system_prompt", None)
    messages = [{"role": "system", "content": system}] if system else []
    messages += [dict(message) for message in getattr(env, "few_shot", None) or []]
    messages.append({"role": "user", "content": row["question"]})
    return {"prompt": messages, **{key: value for key, value in row.items() if key != "question"}}


# ------------------------------------------------------------------ the rubric


def reward_functions(rubric: Any) -> list[tuple[Any, float, dict[str, Any]]]:
    """``(function, weight, class objects)`` of a ``Rubric``, a ``RubricGroup``'s rubrics in turn."""
    if isinstance(getattr(rubric, "rubrics", None), list):
        return [entry for inner in rubric.rubrics for entry in reward_functions(inner)]
    funcs = list(getattr(rubric, "funcs", None) or getattr(rubric, "reward_funcs", None) or [])
    weights = list(getattr(rubric, "weights", None) or getattr(rubric, "reward_weights", None) or [1.0] * len(funcs))
    objects = dict(getattr(rubric, "class_objects", None) or {})
    if "parser" not in objects and getattr(rubric, "parser", None) is not None:
        objects["parser"] = rubric.parser
    return [(func, float(weight), objects) for func, weight in zip(funcs, weights)]


def _is_group(func: Any) -> bool:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return False
    returns = signature.return_annotation
    return bool(set(signature.parameters) & GROUP_PARAMETERS) or returns is list or getattr(returns, "__origin__", None) is list


def _call(func: Any, available: dict[str, Any]) -> Any:
    """``func`` with the keywords it names (all of them when it takes ``**kwargs``), as verifiers calls it."""
    parameters = inspect.signature(func).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return func(**available)
    return func(**{p.name: available[p.name] for p in parameters if p.name in available})


def rubric(prompts: list[Any], completions: list[Any], env: str = "", env_args: dict[str, Any] | None = None,
           log_metric: Any = None, **columns: Any) -> list[float]:
    """The environment's rubric score of each completion (module docstring), batched (minirl's TRL-style call); each
    reward function's values go to ``log_metric`` (TRL's, logged as ``reward/<entry name>/<function name>``)."""
    from minirl.tasks.reward_functions import resolve

    environment = load(env, env_args)
    count = len(completions)
    answers = columns.get("answer") or [""] * count
    skip = {"answers", "completion_ids", "trainer_state", "log_metric", "log_extra", "environments"}
    rows = [{key: value[i] for key, value in columns.items() if key not in skip and isinstance(value, list)
             and len(value) == count} for i in range(count)]
    states = []
    for i, row in enumerate(rows):
        row |= {"prompt": prompts[i], "completion": completions[i], "answer": answers[i]}
        row.setdefault("info", {})
        row.setdefault("task", "default")
        states.append({**row, "input": dict(row), "responses": [], "trajectory": [
            {"prompt": prompts[i], "completion": completions[i], "reward": None, "advantage": None}]})
    entries = reward_functions(environment.rubric)
    names = _names([getattr(func, "__name__", type(func).__name__) for func, _, _ in entries])
    values = resolve(_score_all(entries, names, rows, states, env))
    for name in names:
        for value in values[name]:
            if value is not None and log_metric is not None:
                log_metric(name, value)  # one a sample: the logged mean is over the samples
    return [float(sum(weight * (values[name][i] or 0.0) for name, (_, weight, _) in zip(names, entries)))
            for i in range(count)]


async def _score_all(entries: list[tuple[Any, float, dict[str, Any]]], names: list[str], rows: list[dict[str, Any]],
                     states: list[dict[str, Any]], env: str) -> dict[str, list[float | None]]:
    values: dict[str, list[float | None]] = {}
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):  # a group: the samples of one prompt in this call
        groups.setdefault(json.dumps(row["prompt"], sort_keys=True, default=str), []).append(i)
    for name, (func, weight, objects) in zip(names, entries):
        try:
            if _is_group(func):
                scores: list[Any] = [None] * len(rows)
                for members in groups.values():
                    got = await _awaited(_call(func, {
                        **objects, "prompts": [rows[i]["prompt"] for i in members],
                        "completions": [rows[i]["completion"] for i in members],
                        "answers": [rows[i]["answer"] for i in members], "states": [states[i] for i in members],
                        "tasks": [rows[i]["task"] for i in members], "infos": [rows[i]["info"] for i in members]}))
                    for i, value in zip(members, list(got)):
                        scores[i] = value
            else:
                scores = list(await asyncio.gather(*(_awaited(_call(func, {**row, **objects, "state": state}))
                                                     for row, state in zip(rows, states))))
            values[name] = [None if value is None else float(value) for value in scores]
        except Exception as error:
            if weight == 0:  # a metric verifiers logs beside the reward: left out here
                values[name] = [None] * len(rows)
                continue
            raise RuntimeError(f"verifiers environment {env!r}: reward function {name} raised "
                               f"{type(error).__name__}: {' '.join(str(error).split())[:200]}") from error
    return values


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
