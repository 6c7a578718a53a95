"""From the ``algo`` config to the callable the trainer differentiates.

The trainer calls ``objective(logp, micro_batch)`` once per micro-batch and sums the gradients,
so every loss is given the denominator of the whole *mini-batch* (responses, tokens or groups):
the accumulated gradient equals the gradient of the loss over the mini-batch, whatever the
micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minirl.algo import POLICY_LOSSES, LossInputs
from minirl.algo.variants.entropy import entropy_bonus_loss, high_entropy_tokens
from minirl.algo.variants.rejection import rejection_keep
from minirl.config import AlgoConfig
from minirl.moe.balance import load_balancing_loss
from minirl.trainer import Objective, Wraps
from minirl.types import Batch


@dataclass(frozen=True)
class PolicyObjective:
    """``POLICY_LOSSES[name]`` with its knobs bound: ``objective(logp, micro) -> (loss, metrics)``.

    A plain picklable object (not a closure), so a trainer rank in another process can run it.
    ``check_nan=False`` (what ``make_objective`` builds): the trainer checks for NaN once per update
    (``Trainer.update``), so no micro-batch's loss waits for the GPU.
    """

    name: str
    knobs: dict
    check_nan: bool = True

    def __call__(self, logp: torch.Tensor, micro: Batch, *, token_keep: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if micro.logp_old is None:
            raise ValueError("the old-log-prob pass must run before an update (batch.logp_old is None)")
        inputs = LossInputs(logp, micro.logp_old, micro.logp_rollout, micro.advantages, micro.mask, micro.group_ids,
                            check_nan=self.check_nan, token_keep=token_keep)
        loss, metrics = POLICY_LOSSES[self.name](inputs, **self.knobs)
        return loss, {key: value for key, value in metrics.items() if key != "loss"}  # tensors: the trainer syncs once


def make_objective(algo: AlgoConfig, minibatch: Batch) -> Objective:
    """``POLICY_LOSSES[algo.name]`` with the configured knobs, for micro-batches of ``minibatch``."""
    knobs = algo.loss_knobs()
    knobs["normalizer"] = algo.minibatch_normalizer(minibatch)  # each variant owns its denominator
    return PolicyObjective(algo.name, knobs, check_nan=False)


@dataclass(frozen=True)
class EntropyBonus:
    """``objective`` minus ``entropy_coef`` x pi_theta's token-mean entropy over the mini-batch
    (``minirl.algo.variants.entropy``; ``normalizer``: the mini-batch's trained tokens, so micro-batch losses add
    up to it). ``wants_entropy``: the trainer passes the differentiable entropy of each forward."""

    objective: Objective
    entropy_coef: float
    normalizer: float
    wants_entropy: bool = True

    def __call__(self, logp: torch.Tensor, micro: Batch, *, entropy: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if entropy is None:
            raise ValueError("algo.entropy_coef > 0 needs the forward's entropy (objective(logp, micro, entropy=...))")
        loss, metrics = self.objective(logp, micro, **_entropy_for(self.objective, entropy))
        bonus, entropy_metrics = entropy_bonus_loss(entropy, micro.mask, entropy_coef=self.entropy_coef,
                                                    normalizer=self.normalizer)
        coef = torch.tensor(self.entropy_coef, dtype=torch.float64, device=loss.device)
        return loss + bonus, {**metrics, **entropy_metrics, "entropy_coef": coef}


def with_entropy_bonus(algo: AlgoConfig, minibatch: Batch, objective: Objective, coef: float | None = None) -> Objective:
    """``objective`` with the entropy bonus (``coef``, default ``algo.entropy_coef``) when it is > 0 or adaptive
    entropy control measures the entropy (``algo.entropy_target``), else ``objective`` itself."""
    coef = float(algo.entropy_coef if coef is None else coef)
    if not coef and algo.entropy_target is None:
        return objective
    return EntropyBonus(objective, coef, float(max(int(minibatch.mask.sum()), 1)))


@dataclass(frozen=True)
class HighEntropyTokens:
    """``objective`` with only the top ``quantile`` of each forward's trained tokens by pi_theta's entropy keeping
    their policy term ("Beyond the 80/20 rule", TRL's ``top_entropy_quantile``; ``minirl.algo.variants.entropy``): the
    quantile is over the micro-batch, as TRL's over its per-device batch; the loss's denominators are unchanged."""

    objective: Objective  # a PolicyObjective: it takes token_keep
    quantile: float
    wants_entropy: bool = True

    def __call__(self, logp: torch.Tensor, micro: Batch, *, entropy: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if entropy is None:
            raise ValueError("algo.top_entropy_quantile < 1 needs the forward's entropy (objective(logp, micro, entropy=...))")
        keep = high_entropy_tokens(entropy, micro.mask, self.quantile)
        return self.objective(logp, micro, token_keep=keep)  # type: ignore[call-arg]


@dataclass(frozen=True)
class CurrentRejection:
    """``algo.reject`` under ``algo.logp_old_source: rollout`` (verl's bypass-mode rejection, its ``rollout_rs`` with
    ``bypass_mode``): the rule bounds this forward's pi_theta/mu_old (detached), so the tokens or responses out of
    bounds keep no loss term in each update; the loss's denominators still count them, as verl's token count of the
    mini-batch does. ``rejected_token_frac``: the trained tokens left out."""

    objective: Objective  # a PolicyObjective: it takes token_keep
    rule: str
    low: float
    high: float

    def __call__(self, logp: torch.Tensor, micro: Batch, *, token_keep: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        mask = micro.mask
        keep = rejection_keep(logp.detach(), micro.logp_rollout, mask, rule=self.rule, low=self.low, high=self.high)
        loss, metrics = self.objective(logp, micro, token_keep=keep if token_keep is None else keep & token_keep)  # type: ignore[call-arg]
        rejected = (mask & ~keep).sum().double() / mask.sum().clamp(min=1).double()
        return loss, {**metrics, "rejected_token_frac": rejected}


def with_current_rejection(algo: AlgoConfig, objective: Objective) -> Objective:
    """``objective`` with verl's bypass-mode rejection when ``algo.reject`` is on and ``logp_old`` is mu_old, else
    itself (the rejection then runs once, on pi_old/mu_old, before the updates: ``minirl.loop``)."""
    if algo.reject == "none" or algo.logp_old_source != "rollout":
        return objective
    return CurrentRejection(objective, algo.reject, float(algo.reject_low), float(algo.reject_high))


@dataclass(frozen=True)
class LoadBalance(Wraps):
    """``objective`` plus ``coef`` x the MoE load-balancing loss of each forward (``algo.router_aux_loss_coef``; TRL's
    ``router_aux_loss_coef``): the trainer passes each micro-batch's router logits; its loss weighs ``rows / total``
    (TRL's mean over equal micro-batches). ``aux_loss``: the update's, weighed alike."""

    objective: Objective
    coef: float
    total_rows: int
    top_k: int
    seen: list = field(default_factory=list)  # this update's (loss, weight) per micro-batch
    wants_router_logits: bool = True  # its own (not passed through)

    def __call__(self, logp: torch.Tensor, micro: Batch, *, router_logits: tuple[torch.Tensor, ...] | None = None,
                 **kwargs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        loss, metrics = self.objective(logp, micro, **kwargs)
        if router_logits is None:  # the metrics pass over the mini-batch, after its micro-batches
            # the mean over the micro-batches it saw, by rows: the mini-batch's (an FSDP rank: its shard's, which
            # the group averages over equal shards). None seen: a trainer group's controller, which ran no forward
            seen = self.seen
            if not seen:
                return loss, metrics
            value = sum(aux * share for aux, share in seen) / sum(share for _, share in seen)
            return loss, {**metrics, "aux_loss": torch.as_tensor(value, dtype=torch.float64)}
        tokens = router_logits[0].shape[0]  # the padded rows' positions, or the packed real tokens (padding-free)
        mask = micro.attention_mask if micro.attention_mask.numel() == tokens else torch.ones(tokens, dtype=torch.bool)
        aux = load_balancing_loss(router_logits, mask.to(router_logits[0].device), self.top_k)
        share = micro.input_ids.shape[0] / self.total_rows
        self.seen.append((aux.detach().double(), share))
        return loss + self.coef * share * aux.to(loss.dtype), metrics


def with_load_balance(algo: AlgoConfig, minibatch: Batch, top_k: int | None, objective: Objective) -> Objective:
    """``objective`` with the load-balancing loss when ``algo.router_aux_loss_coef`` > 0, else itself."""
    if not algo.router_aux_loss_coef:
        return objective
    if top_k is None:
        raise ValueError("algo.router_aux_loss_coef needs an MoE model that returns its router logits")
    return LoadBalance(objective, float(algo.router_aux_loss_coef), minibatch.input_ids.shape[0], top_k)


def with_high_entropy_tokens(algo: AlgoConfig, objective: Objective) -> Objective:
    """``objective`` trained on its high-entropy tokens when ``algo.top_entropy_quantile`` < 1, else itself."""
    return objective if algo.top_entropy_quantile >= 1 else HighEntropyTokens(objective, float(algo.top_entropy_quantile))


def _entropy_for(objective: Objective, entropy: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The ``entropy`` keyword for an inner objective that wants it (a wrapper passes it on), else none."""
    return {"entropy": entropy} if entropy is not None and getattr(objective, "wants_entropy", False) else {}
