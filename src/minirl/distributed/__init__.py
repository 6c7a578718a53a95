"""Past one process: a trainer group on torch.distributed FSDP2, engine groups, Ray placement.

``build_placement(cfg, ...)`` reads the ``cluster`` config section and returns the engine and the
trainer ``minirl.loop`` talks to; with the defaults they are the single-process ``NativeEngine``
and ``Trainer``. See ``docs/distributed.md``.
"""

from minirl.distributed.group import EngineGroup, GroupReplay, TrainerGroup, WorkerError
from minirl.distributed.placement import Placement, build_placement, trainer_in_ranks

__all__ = ["EngineGroup", "GroupReplay", "Placement", "TrainerGroup", "WorkerError", "build_placement", "trainer_in_ranks"]
