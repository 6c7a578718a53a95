"""The frozen reference policy of the KL penalty (``algo.kl_coef`` > 0; ``minirl.algo.variants.reference_kl``).

``Reference.logprobs(batch)`` scores a global batch with the reference, once per global step, into
``batch.logp_ref``; ``ReferenceKL`` adds ``kl_coef`` x the KL estimate to the policy objective on
every micro-batch; ``Reference.sync`` moves the reference toward the policy (``algo.ref_sync_every_updates``,
TR-DPO). With LoRA the reference is the base model with the adapters disabled (no second
copy, as TRL and verl do); without, a frozen copy of the model as the run started (``deepcopy``:
one more set of weights in memory). The reference routes naturally: it is another policy, not the
one whose routes R2/R3 replay. On FSDP2 trainer ranks each rank holds its shard of the frozen copy and scores
its rows (``minirl.distributed``: ``TrainerRank``, ``GroupReference``); ``build_reference`` picks the one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from minirl.algo.variants.reference_kl import reference_kl_loss
from minirl.models.lora import adapters_disabled, has_lora
from minirl.trainer import Objective, Trainer, Wraps, full_state, load_full_state, local_shard, reshard_all
from minirl.types import Batch


def build_reference(trainer: Any) -> Any:
    """The reference of a run's trainer: a ``Reference`` beside a ``Trainer``; the ranks' own, behind a
    ``GroupReference``, for a trainer group."""
    if isinstance(trainer, Trainer):
        return Reference(trainer)
    return trainer.reference()


class Reference:
    """The reference policy of ``trainer`` (built when the run starts, before any update); ``frozen_model``: the
    copy to freeze (a trainer rank's, sharded as its policy; default a ``deepcopy`` of ``trainer.model``)."""

    def __init__(self, trainer: Trainer, frozen_model: torch.nn.Module | None = None) -> None:
        self.trainer = trainer
        self.frozen: Trainer | None = None
        if not has_lora(trainer.model):
            model = (frozen_model if frozen_model is not None else copy.deepcopy(trainer.model)).eval()
            self.frozen = Trainer(model, lr=0.0, micro_batch_sequences=trainer.micro_batch_sequences,
                                  micro_batch_max_tokens=trainer.micro_batch_max_tokens, precision=trainer.precision,
                                  padding_free=trainer.padding_free, shared_prompt=trainer.shared_prompt,
                                  logprob_chunk_tokens=trainer.logprob_chunk_tokens,
                                  logits_temperature=trainer.logits_temperature,
                                  collective=trainer.collective)  # an FSDP rank's: its passes agree with the peers'
            model.requires_grad_(False)  # only ever scored (the Trainer's optimizer never steps)

    @torch.no_grad()
    def sync(self, alpha: float) -> None:
        """pi_ref <- alpha pi_theta + (1 - alpha) pi_ref, parameter by parameter (``algo.ref_sync_every_updates``;
        TR-DPO's soft update, written as TRL's ``SyncRefModelCallback`` writes it)."""
        if self.frozen is None:
            raise ValueError("algo.ref_sync_every_updates: the LoRA reference (adapters off) has no copy to sync")
        reshard_all(self.trainer.model)  # FSDP2 ranks: both models as their shards (a forward leaves the root gathered)
        reshard_all(self.frozen.model)
        for ref, param in zip(self.frozen.model.parameters(), self.trainer.model.parameters(), strict=True):
            local_shard(ref).mul_(1.0 - alpha).add_(local_shard(param), alpha=alpha)  # the same shard of both on a rank

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The frozen copy's weights (a synced reference is checkpointed with the run); empty with LoRA. On a trainer
        rank: the full weights, gathered from the shards (a collective: every rank calls it)."""
        if self.frozen is None:
            return {}
        return {k: v.detach().clone() for k, v in full_state(self.frozen.model, self.trainer.collective).items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.frozen is None or not state:
            return
        load_full_state(self.frozen.model, state, self.trainer.collective)  # on a rank: into its shards

    @torch.no_grad()
    def logprobs(self, batch: Batch) -> torch.Tensor:
        """log pi_ref of every target token of ``batch`` [B, T] (0 where ``batch.mask`` is False)."""
        if self.frozen is not None:
            return self.frozen.score(batch, entropy=False).logp
        with adapters_disabled(self.trainer.model):
            return self.trainer.score(batch, entropy=False).logp


@dataclass(frozen=True)
class ReferenceKL(Wraps):
    """``objective`` plus ``kl_coef`` x the token-mean reference KL over the mini-batch (``normalizer``:
    the mini-batch's trained tokens, so micro-batch losses add up to it)."""

    objective: Objective
    kl_coef: float
    kind: str
    normalizer: float
    unbiased: bool = False  # algo.kl_loss_unbiased: each estimate weighed by pi_theta/pi_old

    def __call__(self, logp: torch.Tensor, micro: Batch, **given: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if micro.logp_ref is None:
            raise ValueError("algo.kl_coef > 0 needs the reference pass before an update (batch.logp_ref is None)")
        loss, metrics = self.objective(logp, micro, **given)
        if self.unbiased and micro.logp_old is None:
            raise ValueError("algo.kl_loss_unbiased needs pi_old before an update (batch.logp_old is None)")
        penalty, kl_metrics = reference_kl_loss(logp, micro.logp_ref, micro.mask, kl_coef=self.kl_coef,
                                                kind=self.kind, normalizer=self.normalizer,  # type: ignore[arg-type]
                                                check_finite=False,  # Trainer.update checks once per update
                                                logp_old=micro.logp_old if self.unbiased else None)
        return loss + penalty, {**metrics, **kl_metrics}  # 0-dim tensors: the trainer syncs once per update


def with_reference_kl(algo: Any, minibatch: Batch, objective: Objective) -> Objective:
    """``objective`` with the KL penalty when ``algo.kl_coef`` > 0, else ``objective`` itself."""
    if not algo.kl_coef:
        return objective
    tokens = float(max(int(minibatch.mask.sum()), 1))
    return ReferenceKL(objective, float(algo.kl_coef), algo.kl_loss_type, tokens, bool(algo.kl_loss_unbiased))
