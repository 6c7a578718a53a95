"""User reward functions: loading by spec, and the errors a broken one raises."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from minirl.tasks import (
    CustomRewardTask,
    ReverseTask,
    RewardFunctionError,
    RewardSpecError,
    TeacherTask,
    build_task,
    load_reward_function,
)
from minirl.types import Prompt

USER_MODULE = '''
def contains_answer(prompt, completion, answer):
    return 1.0 if answer in completion else 0.0

class Scorers:
    @staticmethod
    def length(prompt, completion, answer):
        return len(completion)

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    package = tmp_path / "user_rewards_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scoring.py").write_text(USER_MODULE)
    (package / "broken.py").write_text("import a_dependency_that_does_not_exist\n")
    (package / "syntax.py").write_text("def f(:\n")
    (package / "raises.py").write_text("LIMIT = 1\nSCALE = LIMIT / undefined_constant\n")
    (package / "uses_verl.py").write_text("from verl.utils.reward_score import gsm8k\n")
    (package / "uses_trl.py").write_text("from trl.rewards import accuracy_reward\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_rewards_pkg.scoring"


def test_load_reward_function_by_module_spec(user_module: str) -> None:
    fn = load_reward_function(f"{user_module}:contains_answer")
    assert fn("p", "... 42", "42") == 1.0
    assert load_reward_function(f"{user_module}:Scorers.length")("p", "abc", "x") == 3


def test_load_reward_function_from_a_file_path(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(USER_MODULE)
    fn = load_reward_function(f"{path}:contains_answer")
    assert fn("p", "7", "7") == 1.0


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon_here", "expected 'package.module:function'"),
        ("module_only:", "expected 'package.module:function'"),
        (":function_only", "expected 'package.module:function'"),
        ("no_such_module_xyz:fn", "module 'no_such_module_xyz' not found"),
        ("user_rewards_pkg.missing:fn", "module 'user_rewards_pkg.missing' not found"),
        ("user_rewards_pkg.scoring:nope", "'user_rewards_pkg.scoring' has no attribute 'nope'"),
        ("user_rewards_pkg.scoring:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not callable"),
        ("user_rewards_pkg.broken:fn", "importing 'user_rewards_pkg.broken' failed: No module named"),
        ("user_rewards_pkg.syntax:f", "importing 'user_rewards_pkg.syntax' failed: SyntaxError"),
        ("user_rewards_pkg.raises:f", "failed: NameError: name 'undefined_constant' is not defined (at "),  # the line
        ("/no/such/file.py:fn", "file '/no/such/file.py' not found"),
    ],
)
def test_bad_reward_specs_give_one_line_naming_the_spec(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(RewardSpecError) as error:
        load_reward_function(spec)
    text = str(error.value)
    if "raises" in spec:  # where in the user's file: its line
        assert text.endswith("raises.py:2, in <module>)"), text
    if "syntax" in spec:
        assert text.endswith("syntax.py:1)"), text
    assert text.startswith(f"reward function {spec!r}: ")
    assert message in text
    assert "\n" not in text


@pytest.mark.parametrize("module, hint", [("uses_verl", "`pip install --no-deps verl`"), ("uses_trl", "`pip install trl`")])
def test_a_file_importing_an_uninstalled_peer_says_how_to_install_it(user_module: str, module: str, hint: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A verl user's scorer importing verl (or a TRL user's importing trl) where it is not installed: the line says how
    to install it here (a plain ``pip install verl`` would replace minirl's transformers)."""
    for peer in ("verl", "trl"):
        monkeypatch.setitem(sys.modules, peer, None)  # not importable, whatever is installed
    with pytest.raises(RewardSpecError) as error:
        load_reward_function(f"user_rewards_pkg.{module}:fn")
    text = str(error.value)
    assert f"importing 'user_rewards_pkg.{module}' failed: " in text and hint in text and "\n" not in text


def _task() -> ReverseTask:
    return ReverseTask(difficulty=3, num_train=4, num_eval=2, seed=0)


def test_custom_reward_task_uses_the_user_function(user_module: str) -> None:
    task = CustomRewardTask(_task(), f"{user_module}:contains_answer")
    prompt = task.train_prompts()[0]
    assert task.reward(prompt, f"blah {prompt.answer} blah") == 1.0  # the built-in verifier gives 0
    assert task.reward(prompt, "nothing") == 0.0
    assert task.train_prompts() == task.base_task.train_prompts()
    assert task.eval_prompts() == task.base_task.eval_prompts()
    assert task.name == "reverse"
    # Still a teacher task: solutions come from the wrapped task.
    assert isinstance(task, TeacherTask)
    assert task.teacher_solution(prompt, "direct") == f"#### {prompt.answer}"


def test_user_function_receives_prompt_completion_answer() -> None:
    calls: list[tuple[str, str, str]] = []

    def record(prompt: str, completion: str, answer: str) -> float:
        calls.append((prompt, completion, answer))
        return True  # a bool counts as 1.0

    task = CustomRewardTask(_task(), record)
    prompt = Prompt(text="rev abc\n", answer="cba")
    assert task.reward(prompt, "#### cba") == 1.0
    assert calls == [("rev abc\n", "#### cba", "cba")]


def raises_value_error(prompt: str, completion: str, answer: str) -> float:
    raise ValueError("bad\ncompletion")


@pytest.mark.parametrize(
    "returned, message",
    [
        (None, "returned None for every one of the 1 sample, expected a number (None means 'does not apply'"),
        ("1.0", "returned str '1.0', expected a number"),
        (math.nan, "returned nan, expected a finite number"),
        (math.inf, "returned inf, expected a finite number"),
    ],
)
def test_user_function_bad_returns_are_errors(returned: object, message: str) -> None:
    def user_fn(prompt: str, completion: str, answer: str) -> object:
        return returned

    task = CustomRewardTask(_task(), user_fn)  # type: ignore[arg-type]
    with pytest.raises(RewardFunctionError) as error:
        task.reward(task.train_prompts()[0], "x")
    assert "user_fn" in str(error.value) and message in str(error.value)


def test_user_function_exception_is_reraised_on_one_line() -> None:
    task = CustomRewardTask(_task(), raises_value_error)
    with pytest.raises(RewardFunctionError) as error:
        task.reward(task.train_prompts()[0], "x")
    assert str(error.value) == (
        f"reward function {__name__}:raises_value_error raised ValueError: bad completion (at "
        f"tests/unit/test_tasks_rewards.py:{raises_value_error.__code__.co_firstlineno + 1}, in raises_value_error)"
    )
    assert isinstance(error.value.__cause__, ValueError)


def test_build_task_with_reward_function(user_module: str) -> None:
    task = build_task("add", difficulty=2, num_train=5, num_eval=1, reward_function=f"{user_module}:contains_answer")
    assert isinstance(task, CustomRewardTask)
    prompt = task.train_prompts()[0]
    assert task.reward(prompt, f"it is {prompt.answer}!") == 1.0
    with pytest.raises(RewardSpecError):
        build_task("add", reward_function="nope")


def test_a_peers_own_module_not_found_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's example tool named as ``verl.tools.gsm8k_tool.Gsm8kTool``: where verl is not installed the line says how to
    install it; where it is but has no such module (its example tools are not in its wheel), it says to copy the file."""
    monkeypatch.setitem(sys.modules, "verl", None)
    with pytest.raises(RewardSpecError, match=r"module 'verl.tools.gsm8k_tool' not found; verl is not installed here: "):
        load_reward_function("verl.tools.gsm8k_tool:Gsm8kTool")
    (tmp_path / "verl" / "tools").mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (tmp_path / "verl" / "tools" / "__init__.py").write_text("")
    monkeypatch.delitem(sys.modules, "verl")
    for name in ("verl.tools", "verl.tools.gsm8k_tool"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RewardSpecError) as error:
        load_reward_function("verl.tools.gsm8k_tool:Gsm8kTool")
    assert "is installed here but has no verl.tools.gsm8k_tool" in str(error.value)
    assert "copy the file beside your config" in str(error.value) and "\n" not in str(error.value)
