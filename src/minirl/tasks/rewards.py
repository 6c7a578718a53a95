"""User reward functions: ``"package.module:function"`` -> ``fn(prompt, completion, answer) -> float``.

A reward function is a plain callable taking the prompt text, the completion text and the
reference answer (all ``str``) and returning a finite number (``bool`` counts as 0/1). The spec
is ``module:attribute`` where ``module`` is an importable dotted name (a module in the working
directory included, as with ``python -m``) or a path to a ``.py`` file, and ``attribute`` may be
dotted (``module:Class.method``). Several weighted functions, batched (TRL's signature), async,
with the data's extra columns as keywords: ``minirl.tasks.reward_functions``.

``CustomRewardTask`` wraps any ``Task`` and scores with such a function; a function that raises,
or returns ``None``, NaN, an infinity or a non-number, stops the run with a one-line
``RewardFunctionError`` naming the function (a broken verifier must not become reward 0) unless
the run asked for a fallback reward (``minirl.tasks.reward_runner.RewardRunner``, which also runs
user functions in a worker process with a timeout).

A module is imported only from the spec it is named by (and once per process: a ``.py`` file
named twice is executed once). This module imports nothing heavy (no torch), so the reward
worker process starts in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import multiprocessing
import numbers
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minirl.tasks.base import Task
    from minirl.types import Prompt

RewardFunction = Callable[[str, str, str], float]

_FILE_MODULES: dict[str, str] = {}
"""Module name given to a reward file imported by path -> the file's absolute path."""


class RewardSpecError(Exception):
    """A reward-function spec that cannot be resolved; one line naming the spec."""


class RewardFunctionError(Exception):
    """A user reward function raised or returned something that is not a finite number."""


VERL_DEFAULT_NAME = "compute_score"
"""The function a bare ``file.py`` spec names (verl's ``custom_reward_function.name`` default)."""


def load_reward_function(spec: str) -> RewardFunction:
    """Import and return the callable named by ``spec`` (``"package.module:function"``, ``"path/to/file.py:function"``,
    or ``"path/to/file.py"`` for its ``compute_score``, as verl's ``custom_reward_function.path`` does)."""
    module_name, colon, attribute_path = spec.partition(":")
    if not colon and module_name.endswith(".py"):  # verl's custom_reward_function.path, with its default name
        attribute_path = VERL_DEFAULT_NAME
    elif not colon or not module_name or not attribute_path:
        raise RewardSpecError(f"reward function {spec!r}: expected 'package.module:function' or 'path/to/file.py[:function]'")
    module = _import_module(spec, module_name)
    target: Any = module
    for part in attribute_path.split("."):
        if not hasattr(target, part):
            hint = f" (a bare file names verl's default; give '{module_name}:function')" if not colon else ""
            raise RewardSpecError(f"reward function {spec!r}: {module_name!r} has no attribute {attribute_path!r}{hint}")
        target = getattr(target, part)
    if not callable(target):
        raise RewardSpecError(f"reward function {spec!r}: {attribute_path!r} is a {type(target).__name__}, not callable")
    return target


def _import_module(spec: str, module_name: str) -> Any:
    try:
        if module_name.endswith(".py"):
            return _import_file(spec, Path(module_name))
        _add_working_directory(module_name)
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] == "slime" and module_name.split(".")[0] != "slime":
            return _with_slime_stand_in(spec, module_name, error)
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            if error.name.split(".")[0] in PEER_INSTALL:  # a peer's own module (verl.tools.gsm8k_tool, trl.rewards)
                raise RewardSpecError(f"reward function {spec!r}: module {module_name!r} not found"
                                      f"{peer_install_hint(error) or _peer_module_hint(module_name)}") from None
            raise RewardSpecError(
                f"reward function {spec!r}: module {module_name!r} not found (looked in the working directory "
                f"{os.getcwd()} and on sys.path; a file path also works: '{module_name.replace('.', '/')}.py:"
                f"{spec.partition(':')[2]}')"
            ) from None
        raise RewardSpecError(f"reward function {spec!r}: importing {module_name!r} failed: {error}"
                              f"{peer_install_hint(error)}") from error
    except RewardSpecError:
        raise
    except Exception as error:  # a user module that fails to import: name it, then the error and where it was raised
        where = (f" (at {error.filename}:{error.lineno})" if isinstance(error, SyntaxError) and error.filename
                 else _raised_at(error))
        raise RewardSpecError(
            f"reward function {spec!r}: importing {module_name!r} failed: {type(error).__name__}: {_one_line(error)}{where}"
        ) from error


WORKER_ENV = "MINIRL_REWARD_WORKER"
"""Set in a reward worker's environment (``minirl.tasks.reward_runner``): what importing a reward module says once,
the main process says, not each worker."""


def _with_slime_stand_in(spec: str, module_name: str, error: ModuleNotFoundError) -> Any:
    """A slime user's reward file importing ``slime.utils.types`` (its ``Sample``) where slime is not installed:
    imported again with minirl's stand-in in place (said once, in the main process); any other slime module is one
    line."""
    from minirl.tasks.slime_types import STAND_IN_MODULES, _StandIn, stand_in_for_slime

    if error.name in STAND_IN_MODULES and not isinstance(sys.modules.get("slime"), _StandIn) and stand_in_for_slime():
        if multiprocessing.parent_process() is None and not os.environ.get(WORKER_ENV):  # said once, by the main process
            print(f"minirl: {module_name} imports {error.name}; slime is not installed here, so it gets minirl's "
                  "stand-in (minirl.tasks.slime_types.Sample: what a slime reward function is handed)", file=sys.stderr)
        return _import_module(spec, module_name)
    raise RewardSpecError(f"reward function {spec!r}: importing {module_name!r} failed: it imports {error.name}, and "
                          "slime is not installed here (minirl stands in for slime.utils.types' Sample only): install "
                          "slime, or import only that") from None


PEER_INSTALL = {
    "verl": "verl is not installed here: `pip install --no-deps verl` and `pip install ray tensordict codetiming "
            "hydra-core dill pylatexenc` make its tools and scorers importable (a plain `pip install verl` would replace "
            "minirl's transformers: verl 0.9 pins < 5.11); verl's default scorer is also "
            "minirl.tasks.verl_scores:default_compute_score, without verl",
    "trl": "TRL is not installed here: `pip install trl` (its trl.rewards functions are also minirl.tasks.trl_rewards, "
           "without TRL)",
}
"""How to install a peer framework that a user's file imports (verl's tools and scorers, TRL's rewards), by package."""


def peer_install_hint(error: ModuleNotFoundError) -> str:
    """``"; <how to install it>"`` when the missing module is a peer framework's (``PEER_INSTALL``), else ``""``."""
    top = (error.name or "").split(".")[0]
    if top not in PEER_INSTALL:
        return ""
    missing = sys.modules[top] is None if top in sys.modules else importlib.util.find_spec(top) is None
    return f"; {PEER_INSTALL[top]}" if missing else ""


def _peer_module_hint(module_name: str) -> str:
    """Where a module of an installed peer framework went: verl's example tools and scorers move between releases."""
    from importlib.metadata import PackageNotFoundError, version

    top = module_name.split(".")[0]
    try:
        installed = f"{top} {version(top)}"
    except PackageNotFoundError:
        installed = top
    return (f"; {installed} is installed here but has no {module_name} (verl's example tools, e.g. its gsm8k_tool, "
            "are not in its wheel: copy the file beside your config, make its imports absolute, and name it there)")


def _add_working_directory(module_name: str) -> None:
    """Make ``module_name`` importable from the working directory, as ``python -m`` would (the
    ``minirl`` console script's ``sys.path[0]`` is its own bin directory, not the working one)."""
    top = module_name.split(".")[0]
    cwd = os.getcwd()
    if cwd in sys.path or "" in sys.path:
        return
    if (Path(cwd) / f"{top}.py").is_file() or (Path(cwd) / top).is_dir():
        sys.path.append(cwd)  # after the installed packages: a local file never shadows a library


def _import_file(spec: str, path: Path) -> Any:
    if not path.is_file():
        raise RewardSpecError(f"reward function {spec!r}: file {str(path)!r} not found")
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    unique_name = f"minirl_user_reward_{path.stem}_{digest}"
    if unique_name in sys.modules:  # imported once per process, like any module
        return sys.modules[unique_name]
    _FILE_MODULES[unique_name] = str(path.resolve())
    module_spec = importlib.util.spec_from_file_location(unique_name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[unique_name] = module  # so pickling and dataclasses inside it work
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique_name]
        raise
    return module


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def function_name(fn: Callable) -> str:
    """``module:qualname`` of ``fn`` (a reward file imported by path is named by its path)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__name__
    module = _FILE_MODULES.get(module, module) if module else module
    return f"{module}:{qualname}" if module else qualname


def reward_spec(fn: Callable) -> str | None:
    """A ``module:qualname`` spec that imports ``fn`` again (in a worker process), or ``None``
    when there is none (a lambda, a closure, a function defined in ``__main__``, an instance)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname or module not in sys.modules:
        return None
    target: Any = sys.modules[module]
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not (target is fn or (target is not None and target == fn)):
        return None
    return f"{_FILE_MODULES.get(module, module)}:{qualname}"


def raised_message(name: str, error: BaseException) -> str:
    """One line: the function, the error and where in the user's code it was raised (the deepest frame outside minirl,
    the standard library and installed packages; a worker process's traceback does not reach the user)."""
    return f"reward function {name} raised {type(error).__name__}: {_one_line(error)}{_raised_at(error)}"


def _raised_at(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    ours = str(Path(__file__).resolve().parents[1])
    libraries = {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")}
    users = [frame for frame in frames if not frame.filename.startswith((ours, *libraries, "<"))]
    if not users:
        return ""
    frame = users[-1]
    try:
        shown = os.path.relpath(frame.filename)
    except ValueError:
        shown = frame.filename
    return f" (at {shown if not shown.startswith('..') else frame.filename}:{frame.lineno}, in {frame.name})"


def check_reward_value(value: Any, name: str) -> float:
    """``value`` as a finite float, or ``RewardFunctionError`` saying what ``name`` returned."""
    if not isinstance(value, numbers.Real):
        raise RewardFunctionError(f"reward function {name} returned {type(value).__name__} {value!r:.60}, expected a number")
    reward = float(value)
    if not math.isfinite(reward):
        raise RewardFunctionError(f"reward function {name} returned {reward}, expected a finite number")
    if abs(reward) > FLOAT32_MAX:  # rewards are float32 tensors: this one would become inf there
        raise RewardFunctionError(f"reward function {name} returned {reward}, which overflows float32 "
                                  f"(|reward| must be at most {FLOAT32_MAX:.4g})")
    return reward


FLOAT32_MAX = 3.4028234663852886e38


def unscored_batch(functions: list[Any], samples: int) -> RewardFunctionError:
    """What a batch no reward function scored says: ``None`` means "does not apply" (TRL's rule); a batch nothing
    applies to may be a mistake (most often a function without a ``return``): a warning in a run (TRL 1.16 warns and
    goes on, the samples' advantages 0), an error for the one sample of ``CustomRewardTask.reward``."""
    names = ", ".join(entry.full_name for entry in functions)
    return RewardFunctionError(
        f"reward function{'s' if len(functions) > 1 else ''} {names} returned None for every one of the {samples} "
        f"sample{'s' if samples != 1 else ''}, expected a number (None means 'does not apply', TRL's rule; some "
        "function must score a batch: a missing return?)")


def call_reward_function(fn: RewardFunction, prompt: str, completion: str, answer: str) -> float:
    """``fn(prompt, completion, answer)`` as a finite float, or ``RewardFunctionError``."""
    try:
        value = fn(prompt, completion, answer)
    except Exception as error:
        raise RewardFunctionError(raised_message(function_name(fn), error)) from error
    return check_reward_value(value, function_name(fn))


class CustomRewardTask:
    """``base_task``'s prompts, scored by user functions (``minirl.tasks.reward_functions``).

    ``fn`` is one ``fn(prompt, completion, answer)`` (a callable or a ``module:function`` spec)
    or a list of ``RewardFn`` (weighted; per-sample or batched). Other attributes (``styles``,
    ``teacher_solution``, ``extract_answer`` ...) are the base task's, so a wrapped
    ``TeacherTask`` is still one.
    """

    def __init__(self, base_task: Task, fn: RewardFunction | str | list, name: str | None = None) -> None:
        from minirl.tasks.reward_functions import make_reward_fn, unique_names

        self.base_task = base_task
        if isinstance(fn, list):
            self.functions = list(fn)
        else:  # one ``task.reward_function``: per-sample ``fn(prompt, completion, answer)``, or verl's either form
            entry = make_reward_fn(fn)
            entry.batched = entry.batched and entry.verl
            self.functions = [entry]
        if not self.functions:
            raise RewardSpecError("task.reward_functions: the list is empty")
        unique_names(self.functions)
        self.fn: RewardFunction = self.functions[0].fn
        self.spec: str | None = self.functions[0].spec
        """How a worker process imports the (first) function again (``None``: it cannot)."""
        self.name = name or base_task.name

    def train_prompts(self) -> list[Prompt]:
        return self.base_task.train_prompts()

    def eval_prompts(self) -> list[Prompt]:
        return self.base_task.eval_prompts()

    def reward(self, prompt: Prompt, completion: str) -> float:
        from minirl.tasks.reward_functions import sample_of

        sample = sample_of(prompt, completion)
        scores = [(entry.weight, entry.score([sample])[0]) for entry in self.functions]
        if all(value is None for _, value in scores):
            raise unscored_batch(self.functions, 1)
        return sum(weight * value for weight, value in scores if value is not None)  # None: does not apply (TRL)

    def __getattr__(self, attribute: str) -> Any:
        if attribute in ("base_task", "spec", "fn", "functions"):  # not yet set (e.g. during unpickling): no recursion
            raise AttributeError(attribute)
        return getattr(self.base_task, attribute)
