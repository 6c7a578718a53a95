"""What slime's reward functions are handed, for a slime user's ``--custom-rm-path`` file to run unchanged.

slime calls ``rm(args, sample)`` with its ``slime.utils.types.Sample``; ``Sample`` here has the fields a reward
function reads (the same names, defaults and ``Status`` values; what only slime's engine fills stays at its
default). A reward file that imports ``from slime.utils.types import Sample`` (to annotate or ``isinstance``-check
it) gets this class where slime itself is not installed: ``stand_in_for_slime`` puts a ``slime.utils.types`` module
holding it in ``sys.modules`` (``minirl.tasks.rewards`` does so when such an import fails, and says so in one line).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

STAND_IN_MODULES = ("slime", "slime.utils", "slime.utils.types")
"""The modules ``stand_in_for_slime`` provides; a file importing any other slime module needs slime itself."""


@dataclass
class Sample:
    """One response as slime's ``Sample`` shows it to a reward function: ``tokens`` are the prompt's and the
    response's token ids, ``response_length`` the response's; ``label`` is the row's ``--label-key`` value as stored
    (a dict stays a dict; None without ``--label-key``); ``index`` counts the step's responses and ``group_index``
    its prompts; ``status`` is ``TRUNCATED`` for a response cut at ``--rollout-max-response-len``, else
    ``COMPLETED``."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Any = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: dict | None = None

    def get_reward_value(self, args: Any) -> Any:
        """The reward, or its ``args.reward_key`` entry (slime's ``--reward-key``)."""
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key else self.reward

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length


def stand_in_for_slime() -> bool:
    """Make ``import slime.utils.types`` give this module's ``Sample`` when slime is not installed; True when the
    stand-in is (now) in place, False when slime itself is importable (then nothing is done)."""
    if isinstance(sys.modules.get("slime"), _StandIn):
        return True
    if "slime" in sys.modules or importlib.util.find_spec("slime") is not None:
        return False
    modules = {name: _StandIn(name) for name in STAND_IN_MODULES}
    modules["slime"].utils = modules["slime.utils"]  # type: ignore[attr-defined]
    modules["slime.utils"].types = modules["slime.utils.types"]  # type: ignore[attr-defined]
    modules["slime.utils.types"].Sample = Sample  # type: ignore[attr-defined]
    sys.modules.update(modules)
    return True


class _StandIn(types.ModuleType):
    """A module of the slime stand-in (a package, so its submodules import)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "minirl's stand-in for slime (minirl.tasks.slime_types)")
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)  # find_spec answers, not raises
