"""verifiers environments as data + reward (``minirl.tasks.verifiers_env``): with a stand-in ``verifiers`` package of the
classic API's shape (``load_environment``, ``SingleTurnEnv`` with ``dataset`` / ``eval_dataset`` / ``rubric``), and once
with the real one when it is importable."""

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
    with pytest.raises(ve.VerifiersError, match=r"verifiers 0\.4\.0 has no load_environment"):
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
