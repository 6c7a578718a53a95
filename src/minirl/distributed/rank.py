"""One rank of the trainer group: the ordinary ``Trainer`` over an FSDP2-sharded model.

Every rank builds the model exactly as the controller does (same source, same seed), attaches its
own ``RoutingReplay`` hooks (before ``fully_shard``, so they stay on the routers), shards every
decoder layer and then the root with ``torch.distributed.fsdp.fully_shard`` over a 1-D device mesh
(gloo on CPU, NCCL on GPU), and wraps it in the same ``Trainer`` the single process uses.

Each call works on this rank's share of the rows (the controller splits every batch into W equal,
contiguous shards; routes travel with their rows). The objective's normaliser is the whole
mini-batch's, so the per-rank losses add up to the single-process loss, and FSDP is told to *sum*
the reduce-scattered gradients (divide factor 1) instead of averaging them: the summed gradient is
the single-process gradient. Gradient-norm clipping sees DTensor gradients and returns the global
norm (``clip_grad_norm_`` reduces across the mesh), so every rank clips, skips or steps alike.

Weights and optimizer state leave a rank only as full, unsharded state dicts
(``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True``), in the single-process
formats: model keys as ``model.state_dict()``, optimizer state keyed by parameter index as
``torch.optim.Optimizer.state_dict()``, so checkpoints are the same whatever W.

With W = 1 (a Ray actor holding the whole trainer) nothing is sharded and no process group exists, unless
``optim.cpu_offload``: then every rank, the only one too, is sharded with FSDP2's ``CPUOffloadPolicy`` (parameters,
gradients and AdamW state in CPU memory; each layer's parameters copied to the device for its forward and backward).
"""

from __future__ import annotations

import copy
import datetime
import socket
import warnings
from dataclasses import replace
from typing import Any

import torch

from minirl.config import Config
from minirl.trainer import (
    NaNLoss,
    ScoreResult,
    Wraps,
    full_optimizer_state,
    full_state,
    load_full_optimizer_state,
    load_full_state,
    local_shard,
)
from minirl.types import Batch


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks FSDP shards one by one (``model.model.layers`` of HF causal LMs)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


class TrainerRank:
    """Rank ``rank`` of ``world``; ``start`` joins the process group and builds the trainer."""

    def __init__(self, cfg: Config, rank: int, world: int, source: str | None = None) -> None:
        self.cfg, self.rank, self.world, self.source = cfg, rank, world, source
        self.sharded = world > 1 or cfg.optim.cpu_offload  # FSDP2 units in a process group (of one, to offload)
        self.trainer: Any = None
        self.replay: Any = None
        self.reference: Any = None
        self.engine_weights: Any = None  # rollout.async_split_mismatch: the kept shards, from the first keep
        self.critic: Any = None  # algo.adv_baseline=critic: this rank's shards of the value model

    def rendezvous_address(self) -> str:
        """``tcp://host:port`` on this rank's node, where rank 0 listens for the others."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        host = "127.0.0.1"
        try:
            import ray

            if ray.is_initialized():
                host = ray.util.get_node_ip_address()
        except ImportError:
            pass
        return f"tcp://{host}:{port}"

    def start(self, init_method: str | None) -> None:
        from minirl.runtime import (
            add_configured_lora,
            build_model,
            build_replay,
            build_trainer,
            seed_everything,
            set_threads,
        )

        cfg = self.cfg
        set_threads(cfg.run.threads or 1)
        seed_everything(cfg.run.seed)
        device = torch.device("cpu")
        if cfg.cluster.device == "cuda":
            local = 0 if _under_ray() else self.rank  # a Ray actor sees only its own GPU(s)
            device = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
            torch.cuda.set_device(device)
        if self.sharded:
            import torch.distributed as dist

            dist.init_process_group(  # a lone rank (a Ray actor) meets itself
                "nccl" if device.type == "cuda" else "gloo", init_method=init_method or self.rendezvous_address(),
                rank=self.rank, world_size=self.world,
                timeout=datetime.timedelta(seconds=cfg.cluster.collective_timeout_s),
            )
        model, _ = build_model(cfg, path=self.source)  # the controller's weights: same source, same seed
        offload = cfg.optim.cpu_offload
        if not offload:  # else fully_shard moves each layer to the device and its shards back to the CPU, one by one
            model.to(device)
        if cfg.algo.adv_baseline == "critic":  # from the starting weights, before LoRA and the replay's hooks
            from minirl.critic import build_critic

            shard = (lambda critic: _shard(critic, device, self.world, cfg.optim.precision, offload)) if self.sharded else None
            self.critic = build_critic(cfg, model, shard=shard)
            # its [B, S, 1] values are a view of the head's [B*S, 1] product, which FSDP2 warns of in case of an in-place
            # op on them; minirl.critic only reads them out of place
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP\w*ForTokenClassification\) returned a "
                                    "view tensor")
        # the KL penalty's reference: the starting weights, copied before the replay's hooks (it routes naturally);
        # with LoRA it is the policy with its adapters off (no copy)
        reference = bool(cfg.algo.kl_coef or cfg.algo.kl_in_reward_coef)
        frozen = copy.deepcopy(model) if reference and cfg.model.lora is None else None
        self.replay = build_replay(cfg, model)  # hooks before fully_shard: they stay on the routers
        add_configured_lora(cfg, model)  # adapters before sharding too (the single process adds them after the hooks)
        self.names = [name for name, param in model.named_parameters() if param.requires_grad]
        if self.sharded:
            _shard(model, device, self.world, cfg.optim.precision, offload)
            if frozen is not None:
                _shard(frozen, device, self.world, cfg.optim.precision, offload)
        # collective: never skip alone, and agree on token budgets: the peers wait in FSDP's collectives
        self.trainer = build_trainer(cfg, model, self.replay, collective=self.sharded)
        self.trainer.share_metric_inputs = True  # the group computes the whole mini-batch's metrics from the shards' inputs
        if reference:
            from minirl.reference import Reference

            self.reference = Reference(self.trainer, frozen_model=frozen)

    # ------------------------------------------------------------------ the Trainer interface, on a shard

    def score(self, shard: Batch, **kwargs: Any) -> ScoreResult:
        return self.trainer.score(shard, **kwargs)

    def gradient(self, shard: Batch, objective: Any, **kwargs: Any) -> Any:
        """``Trainer.gradient`` on this rank's rows: its parameters' local gradient shards, flattened (and the
        shard's log-probs with ``with_logp``). A NaN log-prob (after the backward: no peer waits) comes back as its
        message, for the group to raise ``FloatingPointError`` as one process would."""
        try:
            return self.trainer.gradient(shard, objective, **kwargs)
        except FloatingPointError as exc:
            return {"fault": str(exc)}

    def update(self, shard: Batch, objective: Any, **kwargs: Any) -> dict[str, Any]:
        faults: list[str] = []
        if self.sharded:  # every rank must run every backward (FSDP collectives), even on a NaN
            objective = _KeepCollectives(objective, faults)
        result = self.trainer.update(shard, objective, **kwargs)
        if result.fault is not None and faults:
            result = replace(result, fault=f"non-finite log-probs ({faults[0]})")
        return {"result": result, "consecutive_faults": self.trainer.consecutive_faults,
                "updates_done": self.trainer.updates_done}

    def replayed_rows(self) -> list[int]:
        return list(self.replay.replayed_rows) if self.replay is not None else []

    # ------------------------------------------------------------------ the KL penalty's reference, on a shard

    def reference_logprobs(self, shard: Batch) -> torch.Tensor:
        return self.reference.logprobs(shard)

    def reference_sync(self, alpha: float) -> None:
        self.reference.sync(alpha)

    def reference_state(self) -> dict[str, torch.Tensor] | None:
        """The reference's full weights (rank 0; others None)."""
        state = self.reference.state_dict()
        return state if self.rank == 0 else None

    def load_reference_state(self, state: dict[str, torch.Tensor]) -> None:
        self.reference.load_state_dict(_owned(state))

    # ------------------------------------------------------------------ the critic, on a shard

    def critic_values(self, shard: Batch) -> torch.Tensor:
        return self.critic.values(shard)

    def critic_update(self, shard: Batch, values_old: torch.Tensor, returns: torch.Tensor,
                      totals: tuple[int, int]) -> dict[str, float]:
        return self.critic.update(shard, values_old, returns, totals=totals)

    def critic_state(self) -> dict[str, Any] | None:
        """The critic's weights and optimizer state in one process's format (rank 0; others None)."""
        state = self.critic.state_dict()
        return state if self.rank == 0 else None

    def load_critic_state(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(_owned(state))

    # ------------------------------------------------------------------ rollout.async_split_mismatch, on a shard

    def engine_weights_keep(self) -> None:
        if self.engine_weights is None:
            from minirl.async_rollout import EngineWeights

            self.engine_weights = EngineWeights(self.trainer)
        self.engine_weights.keep()

    def engine_weights_logprobs(self, shard: Batch, replay_routes: bool = False) -> torch.Tensor:
        return self.engine_weights.logprobs(shard, replay_routes=replay_routes)

    def engine_weights_state(self) -> dict[str, torch.Tensor] | None:
        """The kept weights in full (rank 0; others None)."""
        state = self.engine_weights.state_dict()
        return state if self.rank == 0 else None

    def load_engine_weights_state(self, state: dict[str, torch.Tensor]) -> None:
        self.engine_weights_keep()  # built on this rank, then its kept shards replaced by the checkpoint's
        self.engine_weights.load_state_dict(_owned(state))

    # ------------------------------------------------------------------ full (unsharded) state

    def state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full model state dict on the CPU (rank 0; other ranks return None)."""
        full = full_state(self.trainer.model, collective=self.sharded)
        return {name: tensor.detach().cpu() for name, tensor in full.items()} if self.rank == 0 else None

    def checkpoint_state(self) -> dict[str, Any] | None:
        """``Trainer.checkpoint_state`` in the single-process format (rank 0; others None)."""
        trainer = self.trainer
        if not self.sharded:
            return _owned(trainer.checkpoint_state())
        optimizer = full_optimizer_state(trainer.model, trainer.optimizer, self.names, collective=True)
        return trainer.checkpoint_state(optimizer=optimizer) if self.rank == 0 else None

    def load_checkpoint_state(self, state: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
        """Full weights and a ``checkpoint_state`` (single-process format) into this rank's shards."""
        trainer = self.trainer
        # own copies: tensors that came over a pipe live in memory shared with the other ranks, and
        # the optimizer would step that one "step" counter once per rank
        state = _owned(state)
        if not self.sharded:
            trainer.model.load_state_dict(weights)
            trainer.load_checkpoint_state(state)
            return
        load_full_state(trainer.model, weights, collective=True)
        trainer.load_checkpoint_state(state, load_optimizer=lambda saved: load_full_optimizer_state(
            trainer.model, trainer.optimizer, saved, self.names, collective=True))

    def memory_layout(self) -> dict[str, Any]:
        """Where this rank's trainable parameters are stored (their local shards), where its trainer computes, its
        FSDP2 units' offload policies and its peak device memory so far: ``{"stored": ["cpu"], "computes": ["cuda:0"],
        "offload": ["CPUOffloadPolicy"], "peak_device_gib": 3.2}`` under ``optim.cpu_offload`` on a GPU (``offload``
        empty when nothing is sharded; ``peak_device_gib`` None on a CPU)."""
        params = [p for p in self.trainer.model.parameters() if p.requires_grad]
        stored = {str(local_shard(p).device) for p in params}
        policies = set()
        for module in self.trainer.model.modules():
            get_state = getattr(module, "_get_fsdp_state", None)  # FSDP2's own record of the policy it was given
            group = getattr(get_state(), "_fsdp_param_group", None) if callable(get_state) else None
            if group is not None:
                policies.add(type(group.offload_policy).__name__)
        device = self.trainer.device
        peak = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None
        return {"stored": sorted(stored), "computes": [str(device)], "offload": sorted(policies), "peak_device_gib": peak}

    def close(self) -> None:
        if self.sharded:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _shard(model: torch.nn.Module, device: torch.device, world: int, precision: str = "fp32", offload: bool = False) -> None:
    """FSDP2: each decoder layer, then the root (embeddings, norm, head); gradients summed.
    ``precision`` bf16: parameters all-gathered in bf16, gradients reduced in fp32 (``minirl.precision``).
    ``offload``: the shards, their gradients and so AdamW's state in CPU memory (``CPUOffloadPolicy``; pinned on CUDA
    for asynchronous copies)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

    from minirl.precision import fsdp_policy

    mesh = init_device_mesh(device.type, (world,))
    policy = fsdp_policy(precision)
    kwargs: dict[str, Any] = {} if policy is None else {"mp_policy": policy}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # the objective already divides by the whole mini-batch: sum the ranks' gradients
            # (plain SUM collectives: gloo has no pre-multiplied sum)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


class _KeepCollectives(Wraps):
    """An objective that turns the objective's ``FloatingPointError`` (a NaN log-prob at a trained
    token) into a NaN loss, so this rank still runs its backward (the other ranks wait in FSDP's
    reduce-scatter) and the NaN global gradient norm makes every rank skip the update together."""

    def __init__(self, objective: Any, faults: list[str]) -> None:
        self.objective, self.faults = objective, faults

    def __call__(self, logp: torch.Tensor, micro: Batch, **given: Any) -> tuple[torch.Tensor, dict[str, float]]:
        try:
            return self.objective(logp, micro, **given)
        except FloatingPointError as exc:
            self.faults.append(str(exc))
            return NaNLoss()(logp, micro)


def _under_ray() -> bool:
    try:
        import ray

        return ray.is_initialized()
    except ImportError:
        return False


def _owned(value: Any) -> Any:
    """``value`` with every tensor replaced by a private CPU copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_owned(v) for v in value]
    return value
