"""Where the engines and the trainer of a run live, chosen by the ``cluster`` config section.

``build_placement`` returns the engine and the trainer the loop talks to:

| cluster                                   | engine                         | trainer                             |
|-------------------------------------------|--------------------------------|-------------------------------------|
| local, 1 rank, 1 engine (the default)     | ``NativeEngine`` (this process) | ``Trainer`` (this process)          |
| local, E engines                          | ``EngineGroup`` of E in-process | as above or below                   |
| local, W > 1 ranks, or ``optim.cpu_offload`` | as above                    | ``TrainerGroup`` of W child ranks   |
| ray                                       | ``EngineGroup`` of E actors    | ``TrainerGroup`` of W actors        |

The loop (``minirl.loop.global_step``) is the same function in every case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from minirl.config import Config, ConfigError


@dataclass
class Placement:
    engine: Any  # a RolloutEngine
    trainer: Any  # a Trainer or a TrainerGroup
    replay: Any | None  # the RoutingReplay the loop validates and counts routes with
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop the group's workers (spawned ranks, Ray actors); idempotent."""
        while self.closers:
            self.closers.pop()()


def trainer_in_ranks(cfg: Config) -> bool:
    """Whether the trainer runs as ranks (child processes or Ray actors) rather than in this process: on Ray, with
    W > 1, or with ``optim.cpu_offload`` (FSDP2's offload, even on one rank)."""
    return cfg.cluster.backend == "ray" or cfg.cluster.trainer_ranks > 1 or cfg.optim.cpu_offload


def require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError(
            "cluster.engine_backend: vllm is not importable here (pip install 'minirl[vllm]' on a CUDA machine); use native"
        ) from None


def make_engine(cfg: Config, model: torch.nn.Module, tokenizer: Any, source: str | None) -> Any:
    """One rollout engine as configured: the built-in ``NativeEngine`` or ``VLLMEngine``."""
    if cfg.cluster.engine_backend == "vllm":
        require_vllm()
        from minirl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine.from_config(cfg, model, tokenizer, source)
    from minirl.runtime import build_engine

    return build_engine(cfg, model, tokenizer, device=cfg.cluster.device)


def build_placement(cfg: Config, model: torch.nn.Module, tokenizer: Any, replay: Any | None, *, start_from: str | None = None) -> Placement:
    """The engine(s) and trainer of a run; ``model`` is the controller's (the trainer's when local)."""
    from minirl.distributed.group import EngineGroup, GroupReplay, InProcess, Spawned, TrainerGroup, gather
    from minirl.distributed.rank import TrainerRank
    from minirl.runtime import add_configured_lora, build_trainer

    c = cfg.cluster
    if c.engine_backend == "vllm":
        require_vllm()
    if c.device == "cuda" and c.backend == "local" and not torch.cuda.is_available():
        raise ConfigError("cluster.device: cuda is not available on this machine; use cpu")
    source = start_from or cfg.model.path or cfg.model.preset

    if c.backend == "ray":
        from minirl.distributed.ray_backend import place

        add_configured_lora(cfg, model)  # the ranks train; ``model`` mirrors their weights, adapters too
        engine_handles, rank_handles, shutdown = place(cfg, source)
        trainer = TrainerGroup(rank_handles, model)
        engine = EngineGroup(engine_handles)
        placement = Placement(engine, trainer, None if replay is None else GroupReplay(replay, trainer),
                              [shutdown, engine.close, trainer.close])
        try:
            engine.load_weights(trainer.state_dict())  # the engines start from the trainer's weights
        except BaseException:
            placement.close()
            raise
        return placement

    engines = [make_engine(cfg, model, tokenizer, source) for _ in range(c.rollout_engines)]
    engine = engines[0] if len(engines) == 1 else EngineGroup([InProcess(f"rollout engine {i}", e) for i, e in enumerate(engines)])
    if not trainer_in_ranks(cfg):
        model.to(c.device)
        return Placement(engine, build_trainer(cfg, model, replay), replay)
    add_configured_lora(cfg, model)  # after the engines (built from the plain model, as in one process): the mirror
    # CPU ranks fork from a server that imported torch and transformers once (a second group in this process, as in
    # the tests or a notebook, starts in milliseconds); CUDA ranks start fresh interpreters (``Spawned``)
    start_method = "spawn" if c.device == "cuda" else "forkserver"
    ranks = [Spawned(f"trainer rank {r}", TrainerRank, cfg, r, c.trainer_ranks, source, start_method=start_method)
             for r in range(c.trainer_ranks)]
    trainer = TrainerGroup(ranks, model)
    try:
        gather([(rank, "__init__") for rank in ranks], "start-up")
        init = gather([(ranks[0], ranks[0].submit("rendezvous_address"))], "start-up")[0]
        gather([(rank, rank.submit("start", init)) for rank in ranks], "start-up")
    except BaseException:
        trainer.close()
        raise
    return Placement(engine, trainer, None if replay is None else GroupReplay(replay, trainer), [trainer.close])
