"""Ray placement (``cluster.backend: ray``): rollout engines and trainer ranks as Ray actors.

The controller (the process running ``minirl.loop``) joins or starts a Ray cluster, checks that
the cluster has the CPUs and GPUs the configured actors ask for, and creates

* E ``EngineHost`` actors, each with ``cluster.cpus_per_engine`` / ``gpus_per_engine``, each
  building its engine (native or vLLM) from the run's model source;
* W ``TrainerRank`` actors in one placement group (``PACK``: on as few nodes as possible, one
  bundle of ``cpus_per_trainer_rank`` / ``gpus_per_trainer_rank`` per rank), which form a
  torch.distributed process group at rank 0's node.

Completions (tokens, ``logp_rollout``, routes) come back as return values; weights go out through
Ray's object store, put once per sync and read by every engine. A task that raises or an actor
that dies becomes one ``WorkerError`` line naming the actor and the call.
"""

from __future__ import annotations

import os
from typing import Any

from minirl.config import Config, ConfigError
from minirl.distributed.group import WorkerError, _one_line


def import_ray() -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        import ray
    except ImportError:
        raise ConfigError("cluster.backend: ray is not installed (pip install 'minirl[ray]'), or use backend=local") from None
    return ray


def start_ray(cfg: Config) -> tuple[Any, bool]:
    """Ray, initialised (joined at ``cluster.ray_address`` or started here); True if started here."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    ray.init(address=cfg.cluster.ray_address, include_dashboard=False, logging_level="WARNING", log_to_driver=True)
    return ray, True


def check_resources(ray: Any, cfg: Config) -> None:
    """One line naming the keys when the actors cannot all be placed (they would wait forever)."""
    c = cfg.cluster
    need_cpu = c.rollout_engines * c.cpus_per_engine + c.trainer_ranks * c.cpus_per_trainer_rank
    need_gpu = c.rollout_engines * c.gpus_per_engine + c.trainer_ranks * c.gpus_per_trainer_rank
    have = ray.cluster_resources()
    have_cpu, have_gpu = float(have.get("CPU", 0)), float(have.get("GPU", 0))
    if need_cpu > have_cpu + 1e-9 or need_gpu > have_gpu + 1e-9:
        raise ConfigError(
            f"cluster.cpus_per_engine: {c.rollout_engines} engines and {c.trainer_ranks} trainer ranks need "
            f"{need_cpu:g} CPUs and {need_gpu:g} GPUs but the Ray cluster has {have_cpu:g} CPUs and {have_gpu:g} GPUs; "
            "lower cluster.cpus_per_*/gpus_per_* or add nodes"
        )


class EngineHost:
    """A rollout engine inside a Ray actor, built from the run's model source."""

    def __init__(self, cfg: Config, source: str | None) -> None:
        from minirl.distributed.placement import make_engine
        from minirl.runtime import build_model, seed_everything, set_threads

        set_threads(cfg.run.threads or 1)
        seed_everything(cfg.run.seed)
        model, tokenizer = build_model(cfg, path=source)
        self.engine = make_engine(cfg, model, tokenizer, source)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine.generate(*args, **kwargs)

    def load_weights(self, state_dict: Any) -> None:
        self.engine.load_weights(state_dict)

    def get_rng_state(self) -> Any:
        return self.engine.get_rng_state() if hasattr(self.engine, "get_rng_state") else {}

    def set_rng_state(self, state: Any) -> None:
        if hasattr(self.engine, "set_rng_state"):
            self.engine.set_rng_state(state)


class RayHandle:
    """A Ray actor as a worker handle (``minirl.distributed.group``)."""

    def __init__(self, name: str, actor: Any) -> None:
        self.name, self.actor = name, actor

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.actor, method).remote(*args, **kwargs)

    def close(self, graceful: bool = True) -> None:
        import ray

        try:
            if graceful and hasattr(self.actor, "close"):
                ray.get(self.actor.close.remote(), timeout=10)
        except Exception:  # the actor may be dead already
            pass
        ray.kill(self.actor)


def gather_ray(calls: list[tuple[RayHandle, Any]], what: str) -> list[Any]:
    """Results in order; the first failed task or dead actor -> ``WorkerError`` at once."""
    import ray

    refs = [ref for _, ref in calls]
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            index = next(i for i, r in enumerate(refs) if r == ref)
            name = calls[index][0].name
            try:
                results[index] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                raise WorkerError(f"{name} failed in {what}: {type(cause).__name__}: {_one_line(cause)}") from None
            except ray.exceptions.RayActorError as exc:
                raise WorkerError(f"{name} died during {what} ({_one_line(exc)})") from None
    return [results[i] for i in range(len(calls))]


def shared(payload: Any, handles: list[Any]) -> Any:
    """``payload`` put once into Ray's object store when the handles are Ray actors, else itself."""
    if handles and isinstance(handles[0], RayHandle):
        import ray

        return ray.put(payload)
    return payload


def place(cfg: Config, source: str | None) -> tuple[list[RayHandle], list[RayHandle], Any]:
    """Create the engine actors and the trainer ranks (started, process group formed).

    Returns ``(engines, ranks, shutdown)``; ``shutdown()`` stops Ray if it was started here."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from minirl.distributed.group import gather
    from minirl.distributed.rank import TrainerRank

    ray, started = start_ray(cfg)
    check_resources(ray, cfg)
    c = cfg.cluster
    engine_actor = ray.remote(EngineHost)
    engines = [
        RayHandle(f"rollout engine {i}", engine_actor.options(num_cpus=c.cpus_per_engine, num_gpus=c.gpus_per_engine).remote(cfg, source))
        for i in range(c.rollout_engines)
    ]
    bundle = {k: v for k, v in (("CPU", c.cpus_per_trainer_rank), ("GPU", c.gpus_per_trainer_rank)) if v > 0}
    group = None
    options: list[dict[str, Any]] = [{} for _ in range(c.trainer_ranks)]
    if bundle:
        group = placement_group([bundle] * c.trainer_ranks, strategy="PACK")
        try:
            ray.get(group.ready(), timeout=120)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"cluster.trainer_ranks: {c.trainer_ranks} bundles of {bundle} could not be placed within 120 s") from None
        options = [
            {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=r)}
            for r in range(c.trainer_ranks)
        ]
    rank_actor = ray.remote(TrainerRank)
    ranks = [
        RayHandle(
            f"trainer rank {r}",
            rank_actor.options(num_cpus=c.cpus_per_trainer_rank, num_gpus=c.gpus_per_trainer_rank, **options[r]).remote(cfg, r, c.trainer_ranks, source),
        )
        for r in range(c.trainer_ranks)
    ]
    init = gather([(ranks[0], ranks[0].submit("rendezvous_address"))], "start-up")[0] if c.trainer_ranks > 1 else None
    gather([(rank, rank.submit("start", init)) for rank in ranks], "start-up")

    def shutdown() -> None:
        if group is not None:
            try:
                remove_placement_group(group)
            except Exception:
                pass
        if started:
            ray.shutdown()

    return engines, ranks, shutdown
