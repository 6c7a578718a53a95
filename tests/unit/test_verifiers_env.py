"""verifiers environments as data + reward (``minirl.tasks.verifiers_env``): with a stand-in ``verifiers`` package of the
classic API's shape (``load_environment``, ``SingleTurnEnv`` with ``dataset`` / ``eval_dataset`` / ``rubric``), one of
0.4's ``verifiers.v1`` (tasksets, ``Task.score``, ``Trace``), and with the real one when it is importable."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from minirl.tasks import RewardRunner, TaskDataError, build_task
from minirl.tasks import verifiers_env as ve
from minirl.tasks.jsonl import JsonlTask
from minirl.types import Prompt

STAND_IN = '''
"""A stand-in of verifiers' classic API, as minirl.tasks.verifiers_env reads it."""
__version__ = "0.1.14-stand-in"
LOADS = []


class Parser:
    def parse_answer(self, completion):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        return text.split("ANSWER:")[-1].strip()


class Rubric:
    def __init__(self, funcs=None, weights=None, parser=None):
        self.funcs, self.weights = list(funcs or []), list(weights or [1.0] * len(funcs or []))
        self.parser = parser or Parser()
        self.class_objects = {"parser": self.parser}


class RubricGroup(Rubric):
    def __init__(self, rubrics):
        super().__init__()
        self.rubrics = rubrics


class Environment:
    def __init__(self, dataset=None, eval_dataset=None, system_prompt=None, few_shot=None, rubric=None, **kwargs):
        import signal
        signal.signal(signal.SIGTERM, lambda *a: None)  # as verifiers' Environment does
        self.dataset, self.eval_dataset = dataset, eval_dataset
        self.system_prompt, self.few_shot, self.rubric = system_prompt, few_shot, rubric or Rubric()


class MultiTurnEnv(Environment):
    pass


class SingleTurnEnv(MultiTurnEnv):
    pass


class ToolEnv(MultiTurnEnv):
    pass


def correct(completion, answer, parser):
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


async def formatted(completion, info, **kwargs):
    text = completion[-1]["content"] if isinstance(completion, list) else completion
    return info["bonus"] if "ANSWER:" in text else 0.0


def num_turns(state):
    return len(state["missing_key"])  # a metric (weight 0) that fails: left out


def distinct(completions, answers):
    texts = [c[-1]["content"] for c in completions]
    return [1.0 / texts.count(t) for t in texts]


def load_environment(env_id, **env_args):
    LOADS.append(env_id)
    if env_id == "stand-in-math":
        rows = [{"question": f"{n}+{n}?", "answer": str(2 * n), "info": {"bonus": 0.5}, "task": "math"}
                for n in range(env_args.get("n", 4))]
        rubric = RubricGroup([Rubric([correct, formatted], [1.0, 0.2]), Rubric([num_turns, distinct], [0.0, 0.1])])
        return SingleTurnEnv(dataset=rows, eval_dataset=rows[:1], system_prompt="Answer after ANSWER:",
                             rubric=rubric)
    if env_id == "stand-in-tools":
        return ToolEnv(dataset=[{"question": "q", "answer": "a"}])
    try:
        __import__(env_id.replace("-", "_"))
    except ImportError as error:
        raise ValueError(f"Could not import '{env_id}' environment. Ensure the package for the '{env_id}' "
                         "environment is installed.") from error
'''


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in as the ``verifiers`` package, on sys.path (reward workers copy it), with no environment cached."""
    package = tmp_path / "stand_in" / "verifiers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, "verifiers", raising=False)
    monkeypatch.setattr(ve, "_ENVS", {})
    yield __import__("verifiers")
    sys.modules.pop("verifiers", None)


def _entry(**kwargs) -> dict:
    return {"function": "minirl.tasks.verifiers_env:rubric", "name": "stand-in-math",
            "kwargs": {"env": "stand-in-math", "env_args": {"n": 4}, **kwargs}}


def test_the_environment_dataset_is_minirl_rows_with_its_eval_dataset_held_out(stand_in) -> None:
    task = JsonlTask('verifiers:stand-in-math {"n": 4}', answer_required=False)
    train, held_out = task.train_prompts(), task.eval_prompts()
    assert len(train) == 4 and len(held_out) == 1  # eval_dataset, not a fraction of the rows
    first = train[0]
    assert first.messages == [{"role": "system", "content": "Answer after ANSWER:"}, {"role": "user", "content": "0+0?"}]
    assert first.answer == "0" and first.meta["info"] == {"bonus": 0.5} and first.meta["task"] == "math"
    assert first.uid == "verifiers:stand-in-math:row 1"
    assert stand_in.LOADS == ["stand-in-math"]  # loaded once, for the data and the eval check
    import signal
    assert signal.getsignal(signal.SIGTERM) is not None and "stand_in" not in repr(signal.getsignal(signal.SIGTERM))


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in a reward worker process
def test_the_rubric_scores_with_its_functions_and_weights(stand_in, timeout_s: float | None) -> None:
    task = build_task("jsonl", path='verifiers:stand-in-math {"n": 4}', answer_required=False,
                      reward_functions=[_entry()])
    prompts = task.train_prompts()[:2]
    completions = [(0, "ANSWER: 0"), (0, "ANSWER: 0"), (1, "2"), (1, "ANSWER: 3")]
    with RewardRunner(task, timeout_s=timeout_s) as runner:
        rewards, stats = runner.score(prompts, completions)
    # correct (1.0) + formatted (0.2 x info bonus 0.5) + distinct (0.1 x 1/copies of the text in its prompt's group)
    assert rewards.tolist() == pytest.approx([1.0 + 0.1 + 0.05, 1.0 + 0.1 + 0.05, 1.0 + 0.0 + 0.1, 0.0 + 0.1 + 0.1])
    assert stats["reward/stand-in-math/correct"] == 0.75
    assert stats["reward/stand-in-math/formatted"] == 0.375
    assert stats["reward/stand-in-math/distinct"] == 0.75
    assert "reward/stand-in-math/num_turns" not in stats  # the failing weight-0 metric is left out


def test_a_multi_turn_environment_is_refused_in_one_line(stand_in) -> None:
    with pytest.raises(TaskDataError, match=r"^verifiers environment 'stand-in-tools' is a ToolEnv, a multi-turn "
                       r"environment; minirl trains single-turn ones \(vf.SingleTurnEnv\) only$"):
        JsonlTask("verifiers:stand-in-tools", answer_required=False)


def test_a_missing_environment_is_one_line(stand_in) -> None:
    with pytest.raises(TaskDataError, match=r"^verifiers environment 'no-such-env' \(args \{\}\): Could not import "
                       r"'no-such-env' environment\. Ensure the package"):
        JsonlTask("verifiers:no-such-env", answer_required=False)


def test_bad_specs_and_splits_are_one_line(stand_in) -> None:
    with pytest.raises(TaskDataError, match="not a JSON object"):
        JsonlTask("verifiers:stand-in-math {n: 4}", answer_required=False)
    with pytest.raises(TaskDataError, match="no environment id"):
        JsonlTask("verifiers:", answer_required=False)
    with pytest.raises(TaskDataError, match="splits train and eval"):
        JsonlTask("verifiers:stand-in-math", answer_required=False, eval_split="dev")


def test_without_verifiers_installed_the_line_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)  # import verifiers raises ImportError
    monkeypatch.setattr(ve, "_ENVS", {})
    with pytest.raises(TaskDataError, match=r"^verifiers environment 'reverse-text': the verifiers package is not "
                       "installed"):
        JsonlTask("verifiers:reverse-text", answer_required=False)


def test_verifiers_without_the_classic_api_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "verifiers", types.SimpleNamespace(__version__="0.4.0"))
    monkeypatch.setattr(ve, "_ENVS", {})
    with pytest.raises(ve.VerifiersError, match=r"verifiers 0\.4\.0 has neither load_environment \(the classic API\) "
                       r"nor verifiers\.v1"):
        ve.load("reverse-text")


def test_with_the_real_verifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real package (the classic API, verifiers < 0.4) with an environment module written here."""
    vf = pytest.importorskip("verifiers")
    if not hasattr(vf, "load_environment"):
        pytest.skip(f"verifiers {getattr(vf, '__version__', '?')} has no classic API")
    datasets = pytest.importorskip("datasets")
    module = tmp_path / "minirl_vf_probe.py"
    module.write_text(textwrap.dedent('''
        import verifiers as vf
        from datasets import Dataset

        def load_environment(n=3):
            rows = Dataset.from_list([{"question": f"Say {k}", "answer": str(k)} for k in range(n)])
            parser = vf.XMLParser(["answer"], answer_field="answer")
            def exact(completion, answer, parser):
                return 1.0 if parser.parse_answer(completion) == answer else 0.0
            async def fmt(completion, parser):
                return 1.0 if parser.parse_answer(completion) is not None else 0.0
            rubric = vf.Rubric(funcs=[exact, fmt], weights=[1.0, 0.5], parser=parser)
            return vf.SingleTurnEnv(dataset=rows, eval_dataset=rows.select(range(1)), system_prompt="Use <answer>.",
                                    parser=parser, rubric=rubric)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ve, "_ENVS", {})
    assert datasets is not None
    task = build_task("jsonl", path='verifiers:minirl-vf-probe {"n": 3}', answer_required=False,
                      reward_functions=[{"function": "minirl.tasks.verifiers_env:rubric", "name": "probe",
                                         "kwargs": {"env": "minirl-vf-probe", "env_args": {"n": 3}}}])
    prompts = task.train_prompts()
    assert len(prompts) == 3 and len(task.eval_prompts()) == 1
    assert prompts[1].messages[-1] == {"role": "user", "content": "Say 1"}
    with RewardRunner(task, timeout_s=None) as runner:
        rewards, stats = runner.score(prompts[:2], [(0, "<answer>0</answer>"), (1, "<answer>7</answer>")])
    assert rewards.tolist() == [1.5, 0.5]
    assert stats["reward/probe/exact"] == 0.5 and stats["reward/probe/fmt"] == 1.0


def test_prompts_keep_their_shape() -> None:
    assert Prompt(text="x", answer="y").messages is None  # (the stand-in rows are chats: a question becomes one)


# ------------------------------------------------------------------ verifiers 0.4: verifiers.v1

V1_STAND_IN = {
    "__init__.py": '__version__ = "0.4.0-stand-in"\n',
    "v1/__init__.py": """
from pydantic import BaseModel


class AgentConfig(BaseModel):
    pass


class TaskData(BaseModel):
    idx: int | None = None
    prompt: str | list | None = None
    system_prompt: str | None = None


class Task:
    NEEDS_CONTAINER = False

    def __init__(self, data, config=None):
        self.data, self.config = data, config

    @property
    def key(self):
        return str(self.data.idx)

    hash = key

    @classmethod
    def data_type(cls):
        return cls.DATA

    @classmethod
    def toolsets(cls, config):
        return []

    async def setup(self, trace, runtime):
        return None

    async def finalize(self, trace, runtime):
        return None

    async def stage_verifier(self, trace, runtime):
        return None

    def hooks(self, attr):
        return sorted((getattr(self, name) for name in dir(type(self)) if hasattr(getattr(type(self), name), attr)),
                      key=lambda fn: fn.__name__)

    async def score(self, trace, runtime=None):  # as verifiers.v1.task.Task.score: by keyword, awaited, weighted
        import asyncio, inspect
        available = {"task": self.data, "trace": trace}
        def call(fn):
            return fn(**{name: available[name] for name in inspect.signature(fn).parameters if name in available})
        metrics, rewards = self.hooks("metric"), self.hooks("reward")
        for fn, value in zip(metrics, await asyncio.gather(*(call(fn) for fn in metrics))):
            trace.metrics[fn.__name__] = float(value)
        for fn, value in zip(rewards, await asyncio.gather(*(call(fn) for fn in rewards))):
            trace.rewards[fn.__name__] = Reward(score=value, weight=fn._vf_weight)


class Reward(BaseModel):
    score: float
    weight: float = 1.0


def reward(weight=1.0):
    def mark(fn):
        fn.reward, fn._vf_weight = True, weight
        return fn
    return mark


def metric(fn):
    fn.metric = True
    return fn


class Taskset:
    INFINITE = False

    def __init__(self, config):
        self.config = config

    def __iter__(self):
        return (task for task in self.load())

    @classmethod
    def task_type(cls):
        return cls.TASK

    @classmethod
    def toolsets(cls, config):
        return []


class SingleAgentEnv:
    pass


class MultiAgentEnv:
    pass
""",
    "v1/types.py": """
from pydantic import BaseModel


class Message(BaseModel):
    role: str
    content: str | None = None


class AssistantMessage(Message):
    role: str = "assistant"
""",
    "v1/graph.py": """
from pydantic import BaseModel
from verifiers.v1.types import Message


class MessageNode(BaseModel):
    message: Message
    parent: int | None = None
    sampled: bool = False
""",
    "v1/trace.py": """
from typing import Any
from pydantic import BaseModel, Field
from verifiers.v1.graph import MessageNode
from verifiers.v1 import Reward


class TraceTask(BaseModel):
    type: str
    data: Any
    key: str | None = None
    hash: str | None = None


class AgentInfo(BaseModel):
    config: Any


class Trace(BaseModel):
    task: TraceTask
    agent: AgentInfo
    nodes: list[MessageNode] = Field(default_factory=list)
    rewards: dict = Field(default_factory=dict)
    metrics: dict = Field(default_factory=dict)
    is_completed: bool = False
    ok: bool = False

    @property
    def reward(self):
        return sum(r.score * r.weight for r in self.rewards.values() if r is not None)

    @property
    def last_reply(self):
        return [n.message.content for n in self.nodes if n.sampled][-1]
""",
    "v1/utils/__init__.py": "",
    "v1/utils/loaders.py": """
import importlib
from pydantic import BaseModel
import verifiers.v1 as vf

LOADS = []


class TasksetConfig(BaseModel):
    id: str = ""
    n: int = 4
    task: dict = {}


def _module(taskset_id):
    try:
        return importlib.import_module("verifiers.v1.tasksets." + taskset_id.replace("-", "_"))
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"taskset {taskset_id!r} not found (tried to import "
                                  f"{taskset_id.replace('-', '_')!r}).") from None


def taskset_config_type(taskset_id):
    return getattr(_module(taskset_id), "CONFIG", TasksetConfig)


def load_taskset(config):
    LOADS.append(config.id)
    return _module(config.id).TASKSET(config)


def environment_class(taskset_id, env_id=""):
    return getattr(_module(taskset_id), "ENV", vf.SingleAgentEnv)


def default_harness_id(taskset_id):
    return getattr(_module(taskset_id), "HARNESS", "bash")
""",
    "v1/tasksets/__init__.py": "",
    "v1/tasksets/stand_in_math.py": """
import verifiers.v1 as vf


class MathData(vf.TaskData):
    answer: str
    bonus: float = 0.5


class MathTask(vf.Task):
    DATA = MathData

    @vf.reward(weight=1.0)
    async def correct(self, task, trace):
        return float(trace.last_reply.split("ANSWER:")[-1].strip() == task.answer)

    @vf.reward(weight=0.2)
    async def formatted(self, task, trace):
        return task.bonus if "ANSWER:" in trace.last_reply else 0.0

    @vf.metric
    async def length(self, trace):
        return float(len(trace.last_reply))


class MathTaskset(vf.Taskset):
    TASK = MathTask

    def load(self):
        for n in range(self.config.n):
            yield self.TASK(MathData(idx=n, prompt=f"{n}+{n}?", answer=str(2 * n), system_prompt="Answer after ANSWER:"))


TASKSET = MathTaskset
""",
    "v1/tasksets/stand_in_sync.py": """
import verifiers.v1 as vf
from verifiers.v1.tasksets.stand_in_math import MathTask, MathTaskset


class SyncTask(MathTask):
    @vf.reward(weight=0.2)
    def formatted(self, task, trace):  # a sync reward: verifiers 0.4 awaits every one, so it fails there
        return 0.0


class TASKSET(MathTaskset):
    TASK = SyncTask
""",
    "v1/tasksets/stand_in_team.py": """
import verifiers.v1 as vf
from verifiers.v1.tasksets.stand_in_math import MathTaskset as TASKSET

ENV = vf.MultiAgentEnv
""",
    "v1/tasksets/stand_in_sandbox.py": """
import verifiers.v1 as vf
from verifiers.v1.tasksets.stand_in_math import MathTask, MathTaskset


class SandboxTask(MathTask):
    async def setup(self, trace, runtime):
        return None


class TASKSET(MathTaskset):
    TASK = SandboxTask
""",
}


@pytest.fixture
def v1_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in of verifiers 0.4 (no load_environment, a verifiers.v1) on sys.path, no environment cached."""
    root = tmp_path / "v1_stand_in"
    for name, text in V1_STAND_IN.items():
        (root / "verifiers" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "verifiers" / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    for module in [name for name in sys.modules if name == "verifiers" or name.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(ve, "_ENVS", {})
    yield __import__("verifiers.v1.utils.loaders").v1.utils.loaders
    for module in [name for name in sys.modules if name == "verifiers" or name.startswith("verifiers.")]:
        sys.modules.pop(module, None)


def _v1_entry() -> dict:
    return {"function": "minirl.tasks.verifiers_env:rubric", "name": "v1-math",
            "kwargs": {"env": "stand-in-math", "env_args": {"n": 4}}}


def test_a_v1_taskset_is_minirl_rows(v1_stand_in) -> None:
    task = JsonlTask('verifiers:stand-in-math {"n": 4}', answer_required=False, eval_fraction=0)
    prompts = task.train_prompts()
    assert len(prompts) == 4 and task.eval_prompts() == []  # one split: no eval_dataset held out
    first = prompts[0]
    assert first.messages == [{"role": "system", "content": "Answer after ANSWER:"}, {"role": "user", "content": "0+0?"}]
    assert first.answer == "0" and first.meta["example_id"] == 0
    assert first.meta["task_data"] == {"idx": 0, "prompt": "0+0?", "system_prompt": "Answer after ANSWER:",
                                       "answer": "0", "bonus": 0.5}
    assert v1_stand_in.LOADS == ["stand-in-math"]  # loaded once
    with pytest.raises(TaskDataError, match=r"a verifiers 0\.4 taskset has one split"):
        JsonlTask("verifiers:stand-in-math", answer_required=False, eval_split="eval")


@pytest.mark.parametrize("timeout_s", [None, 5.0])  # in this process, and in a reward worker process
def test_a_v1_task_scores_with_its_rewards_weights_and_metrics(v1_stand_in, timeout_s: float | None) -> None:
    task = build_task("jsonl", path='verifiers:stand-in-math {"n": 4}', answer_required=False, eval_fraction=0,
                      reward_functions=[_v1_entry()])
    prompts = task.train_prompts()[:2]
    completions = [(0, "ANSWER: 0"), (0, "0"), (1, "ANSWER: 3")]
    with RewardRunner(task, timeout_s=timeout_s) as runner:
        rewards, stats = runner.score(prompts, completions)
    # correct (weight 1) + formatted (weight 0.2 x the task's bonus 0.5); length is a metric (not summed)
    assert rewards.tolist() == pytest.approx([1.0 + 0.1, 1.0, 0.0 + 0.1])
    assert stats["reward/v1-math/correct"] == pytest.approx(2 / 3)
    assert stats["reward/v1-math/formatted"] == pytest.approx(1 / 3)
    assert stats["reward/v1-math/length"] == pytest.approx((9 + 1 + 9) / 3)


def test_a_v1_sync_reward_stops_with_verifiers_error_in_one_line(v1_stand_in) -> None:
    prompt = JsonlTask("verifiers:stand-in-sync", answer_required=False, eval_fraction=0).train_prompts()[0]
    with pytest.raises(RuntimeError, match=r"^verifiers environment 'stand-in-sync': TypeError: .*await"):
        ve.rubric([prompt.messages], [[{"role": "assistant", "content": "ANSWER: 0"}]], env="stand-in-sync",
                  env_args={}, task_data=[prompt.meta["task_data"]])


@pytest.mark.parametrize(("env_id", "says"), [
    ("stand-in-team", r"exports its own Env \(MultiAgentEnv, its agents' run\)"),
    ("stand-in-sandbox", r"prepares a runtime for each task \(SandboxTask\.setup"),
])
def test_a_multi_turn_v1_environment_is_refused_in_one_line(v1_stand_in, env_id: str, says: str) -> None:
    with pytest.raises(TaskDataError, match=rf"^verifiers environment '{env_id}' {says}.*, a multi-turn environment; "
                       r"minirl trains single-turn ones only \(a plain taskset, played as one chat completion\)$"):
        JsonlTask(f"verifiers:{env_id}", answer_required=False)


def test_a_missing_v1_environment_and_bad_args_are_one_line(v1_stand_in) -> None:
    with pytest.raises(TaskDataError, match=r"^verifiers environment 'no-such-env' \(args \{\}\): taskset "
                       r"'no-such-env' not found"):
        JsonlTask("verifiers:no-such-env", answer_required=False)
    with pytest.raises(TaskDataError, match=r"^verifiers environment 'stand-in-math' \(args \{'n': 'x'\}\): n: "):
        JsonlTask('verifiers:stand-in-math {"n": "x"}', answer_required=False)


def test_with_the_real_verifiers_v1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real verifiers 0.4 (``verifiers.v1``, no classic API) with a taskset module written here."""
    vf = pytest.importorskip("verifiers")
    if hasattr(vf, "load_environment"):
        pytest.skip(f"verifiers {getattr(vf, '__version__', '?')} has the classic API (read first)")
    pytest.importorskip("verifiers.v1")
    (tmp_path / "minirl_vf1_probe.py").write_text(textwrap.dedent('''
        import verifiers.v1 as vf

        class ProbeData(vf.TaskData):
            answer: str

        class ProbeTask(vf.Task[ProbeData]):
            @vf.reward(weight=1.0)
            async def exact(self, task, trace) -> float:
                return float(trace.last_reply == task.answer)

            @vf.reward(weight=0.5)
            async def has_digit(self, trace: vf.Trace) -> float:
                return float(any(c.isdigit() for c in trace.last_reply))

        class ProbeConfig(vf.TasksetConfig):
            num_tasks: int = 4

        class ProbeTaskset(vf.Taskset[ProbeTask, ProbeConfig]):
            def load(self):
                for n in range(self.config.num_tasks):
                    yield ProbeTask(ProbeData(prompt=f"Say {n}", answer=str(n), system_prompt="Be brief."),
                                    self.config.task)

        __all__ = ["ProbeTaskset"]
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ve, "_ENVS", {})
    task = build_task("jsonl", path='verifiers:minirl-vf1-probe {"num_tasks": 3}', answer_required=False,
                      eval_fraction=0, reward_functions=[{"function": "minirl.tasks.verifiers_env:rubric",
                                                          "name": "probe", "kwargs": {"env": "minirl-vf1-probe",
                                                                                      "env_args": {"num_tasks": 3}}}])
    prompts = task.train_prompts()
    assert len(prompts) == 3 and prompts[1].messages[-1] == {"role": "user", "content": "Say 1"}
    with RewardRunner(task, timeout_s=None) as runner:
        rewards, stats = runner.score(prompts[:2], [(0, "0"), (1, "7"), (1, "no")])
    assert rewards.tolist() == [1.5, 0.5, 0.0]
    assert stats["reward/probe/exact"] == pytest.approx(1 / 3) and stats["reward/probe/has_digit"] == pytest.approx(2 / 3)
