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
classic API; 0.3's ``verifiers.legacy``).

verifiers 0.4 (0.4.0 checked; no ``load_environment``, its ``verifiers.v1`` API; used when the classic API is absent):
``ENV_ID`` is a taskset id (``--env.taskset.id``; ``verifiers/v1/utils/loaders.py``: ``taskset_class``,
``taskset_config_type``, ``load_taskset``, ``environment_class``, ``default_harness_id``) and the JSON arguments its
``TasksetConfig`` fields. Its rows are the taskset's tasks (``verifiers/v1/taskset.py``: iterating sets ``idx`` and
the config's system prompt; ``verifiers/v1/task.py``: ``TaskData.prompt`` / ``system_prompt``): ``prompt`` is the
system prompt then the prompt (a string as the user's message), ``answer`` a task's ``answer`` field when it has one,
``example_id`` its ``idx``, ``task_data`` its ``TaskData`` (dumped; the reward rebuilds the task from it, with the
taskset's ``config.task``). ``rubric`` scores a completion with ``Task.score(trace)`` itself, no runtime, over a
``Trace`` (``verifiers/v1/trace.py``, ``graph.py``) of the prompt's messages and one sampled assistant message: its
``@vf.reward`` / ``@vf.metric`` methods and plugged ``config.task.rewards`` (async, called by keyword with ``task``
and ``trace``; ``verifiers/v1/utils/decorators.py``); the reward is ``trace.reward`` (``sum(score * weight)``), each
reward's score and each metric logged as ``reward/<entry name>/<name>``; scoring that raises stops the step. v1 has no
single-turn class: a run's harness decides (verifiers' default for a plain taskset is the ``bash`` agent); minirl
plays a task as one chat completion, as the ``null`` harness without tools does, and refuses (one line) a taskset
that exports its own ``Env`` or harness, has toolsets, needs a container or overrides ``setup`` / ``finalize`` /
``stage_verifier``, is infinite, has a task with no prompt, or a reward / metric that needs the ``runtime``. A taskset
has one split (``task.eval_path: verifiers:ID {args}`` names held-out tasks). prime-rl's orchestrator (its
``orchestrator/envs.py``) runs a v1 env in verifiers' env server by task index; minirl reads the taskset itself.

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
                             "(pip install verifiers and the environment's package)") from None
    loader = getattr(verifiers, "load_environment", None)
    if loader is None:
        try:
            from verifiers.v1.utils import loaders
        except ImportError:
            version = getattr(verifiers, "__version__", "?")
            raise VerifiersError(f"verifiers environment {env_id!r}: verifiers {version} has neither load_environment "
                                 "(the classic API) nor verifiers.v1 (0.4's)") from None
        return _guarded(env_id, env_args, lambda: _load_v1(loaders, env_id, env_args))
    return _guarded(env_id, env_args, lambda: loader(env_id, **env_args))


def _guarded(env_id: str, env_args: dict[str, Any], build: Any) -> Any:
    installer = signal.signal
    signal.signal = lambda signum, handler: signal.getsignal(signum)  # type: ignore[assignment]
    try:  # verifiers' Environment sets SIGINT / SIGTERM handlers (and raises off the main thread): minirl's stay
        return build()
    except VerifiersError:
        raise
    except Exception as error:
        errors = getattr(error, "errors", None)  # pydantic's ValidationError: its first error, by field
        if callable(errors) and errors():
            first = errors()[0]
            reason = f"{'.'.join(str(part) for part in first.get('loc', ()))}: {first.get('msg', '')}"
        else:
            reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise VerifiersError(f"verifiers environment {env_id!r} (args {env_args}): {reason}") from None
    finally:
        signal.signal = installer


def _checked(env_id: str, env: Any) -> Any:
    if isinstance(env, V1Taskset):
        return env
    classes = [cls.__name__ for cls in type(env).__mro__]
    if "SingleTurnEnv" not in classes:
        raise VerifiersError(f"verifiers environment {env_id!r} is a {type(env).__name__}, a multi-turn environment; "
                             "minirl trains single-turn ones (vf.SingleTurnEnv) only")
    return env


# ------------------------------------------------------------------ verifiers 0.4: verifiers.v1


class V1Taskset:
    """A verifiers 0.4 taskset (``verifiers.v1``) that minirl plays as one chat completion a task."""

    def __init__(self, env_id: str, taskset: Any, task_type: Any, agent_config: Any) -> None:
        self.env_id, self.taskset, self.task_type, self.agent_config = env_id, taskset, task_type, agent_config

    def task(self, data: dict[str, Any]) -> Any:
        """The task of a row's ``task_data`` (its ``TaskData``, dumped), with the taskset's task config."""
        return self.task_type(self.task_type.data_type().model_validate(data), self.taskset.config.task)


def _load_v1(loaders: Any, env_id: str, env_args: dict[str, Any]) -> V1Taskset:
    """``env_id`` as a v1 taskset id (``--env.taskset.id``), ``env_args`` its ``TasksetConfig`` fields; one a
    single-turn run can play (module docstring), or ``VerifiersError``."""
    import verifiers.v1 as vf

    taskset = loaders.load_taskset(loaders.taskset_config_type(env_id).model_validate({**env_args, "id": env_id}))
    task_type = type(taskset).task_type()
    env_class = loaders.environment_class(env_id)
    harness = loaders.default_harness_id(env_id)
    refusal = ""
    if env_class is not vf.SingleAgentEnv:
        refusal = f"exports its own Env ({env_class.__name__}, its agents' run)"
    elif harness != "bash":
        refusal = f"ships its own harness ({harness!r})"
    elif taskset.toolsets(taskset.config) or task_type.toolsets(taskset.config.task):
        refusal = "gives the model tools (toolsets)"
    elif task_type.NEEDS_CONTAINER or any(getattr(task_type, hook) is not getattr(vf.Task, hook)
                                          for hook in ("setup", "finalize", "stage_verifier")):
        refusal = f"prepares a runtime for each task ({task_type.__name__}.setup / finalize / NEEDS_CONTAINER)"
    elif taskset.INFINITE:
        refusal = "is infinite (Taskset.INFINITE)"
    if refusal:
        raise VerifiersError(f"verifiers environment {env_id!r} {refusal}, a multi-turn environment; minirl trains "
                             "single-turn ones only (a plain taskset, played as one chat completion)")
    return V1Taskset(env_id, taskset, task_type, vf.AgentConfig())


def _v1_runtime_hooks(env: V1Taskset, task: Any) -> list[str]:
    hooks = [*task.hooks("reward"), *task.hooks("metric")]
    return [fn.__name__ for fn in hooks if (p := inspect.signature(fn).parameters.get("runtime")) is not None
            and p.default is inspect.Parameter.empty]


def _v1_rows(env: V1Taskset) -> Iterator[dict[str, Any]]:
    tasks = iter(env.taskset)
    while True:
        try:
            task = next(tasks)
        except StopIteration:
            return
        except Exception as error:  # the taskset's load() (a dataset download, ...)
            reason = " ".join(str(error).split())[:300] or type(error).__name__
            raise VerifiersError(f"verifiers environment {env.env_id!r}: its taskset's load() raised {reason}") from None
        data = task.data
        if data.prompt is None:
            raise VerifiersError(f"verifiers environment {env.env_id!r}: task {data.idx} has no prompt (the user opens "
                                 "the conversation), a multi-turn environment; minirl trains single-turn ones only")
        if needs := _v1_runtime_hooks(env, task):
            raise VerifiersError(f"verifiers environment {env.env_id!r}: {', '.join(needs)} need the task's runtime "
                                 "(a sandbox); minirl scores single-turn completions without one")
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages += [message.model_dump(mode="json", exclude_none=True) for message in data.prompt]
        row: dict[str, Any] = {"prompt": messages, "example_id": data.idx,
                               "task_data": data.model_dump(mode="json", exclude_none=True)}
        answer = getattr(data, "answer", None)
        if isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
            row["answer"] = answer
        yield row


def _v1_rubric(env: V1Taskset, prompts: list[Any], completions: list[Any], columns: dict[str, Any],
               log_metric: Any) -> list[float]:
    """Each completion scored by its task's ``Task.score(trace)`` (verifiers' own scoring, no runtime) over a
    ``Trace`` of the prompt and the completion; the reward is ``trace.reward``."""
    from minirl.tasks.reward_functions import resolve

    task_data = columns.get("task_data")
    if not isinstance(task_data, list) or len(task_data) != len(completions):
        raise RuntimeError(f"verifiers environment {env.env_id!r}: the rows have no task_data column (read them "
                           f"with task.path: verifiers:{env.env_id})")
    tasks = [env.task(data) for data in task_data]  # each row's task, built once
    traces = [_v1_trace(env, prompt, completion, task) for prompt, completion, task in zip(prompts, completions, tasks)]
    for error in resolve(_v1_score_all(traces, tasks)):
        if error is not None:
            raise RuntimeError(f"verifiers environment {env.env_id!r}: {' '.join(error.split())[:300]}")
    for trace in traces:
        for name, reward in trace.rewards.items():
            if reward is not None and log_metric is not None:
                log_metric(name, reward.score)  # one a sample: the logged mean is over the samples
        for name, value in trace.metrics.items():
            if value is not None and log_metric is not None:
                log_metric(name, value)
    return [float(trace.reward) for trace in traces]


async def _v1_score_all(traces: list[Any], tasks: list[Any]) -> list[str | None]:
    async def score(trace: Any, task: Any) -> str | None:
        try:
            await task.score(trace)
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return None

    return list(await asyncio.gather(*(score(trace, task) for trace, task in zip(traces, tasks))))


def _v1_trace(env: V1Taskset, prompt: Any, completion: Any, task: Any) -> Any:
    """A ``Trace`` of the prompt's messages and the sampled completion (one assistant turn)."""
    from pydantic import TypeAdapter
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask
    from verifiers.v1.types import AssistantMessage, Message

    read = TypeAdapter(Message).validate_python
    prompt_messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    replies = completion if isinstance(completion, list) else [{"role": "assistant", "content": str(completion)}]
    nodes = [MessageNode(message=read(dict(message)), parent=index - 1 if index else None)
             for index, message in enumerate(prompt_messages)]
    for message in replies:
        nodes.append(MessageNode(message=AssistantMessage(content=str(dict(message).get("content") or "")),
                                 parent=len(nodes) - 1 if nodes else None, sampled=True))
    return Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                 agent=AgentInfo(config=env.agent_config), nodes=nodes, is_completed=True, ok=True)


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
    env = load(env_id, args)
    return not isinstance(env, V1Taskset) and _dataset(env, "eval_dataset") is not None


def iter_env_rows(spec: str, split: str = "train") -> Iterator[tuple[str, Any]]:
    """``(where, row)`` of the environment's ``dataset`` (``split`` train) or ``eval_dataset`` (eval / test /
    validation), as ``minirl.tasks.data.iter_rows`` yields a file's."""
    env_id, args = parse_spec(spec)
    env = load(env_id, args)
    if split != "train" and split not in EVAL_SPLITS:
        raise VerifiersError(f"{spec}: a verifiers environment has the splits train and eval (got {split!r})")
    if isinstance(env, V1Taskset):
        if split != "train":
            raise VerifiersError(f"{spec}: a verifiers 0.4 taskset has one split; name the held-out tasks as "
                                 f"task.eval_path: verifiers:{env_id} {{its taskset args}}")
        for index, row in enumerate(_v1_rows(env), start=1):
            yield f"{PREFIX}{env_id}:row {index}", row
        return
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
    if isinstance(environment, V1Taskset):
        return _v1_rubric(environment, prompts, completions, columns, log_metric)
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
