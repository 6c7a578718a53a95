"""From the ``algo`` config to the callable the trainer differentiates.

The trainer calls ``objective(logp, micro_batch)`` once per micro-batch and sums the gradients,
so every loss is given the denominator of the whole *mini-batch* (responses, tokens or groups):
the accumulated gradient equals the gradient of the loss over the mini-batch, whatever the
micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minirl.algo import POLICY_LOSSES, LossInputs
from minirl.algo.entropy import entropy_bonus_loss
from minirl.config import AlgoConfig
from minirl.trainer import Objective
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

    def __call__(self, logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if micro.logp_old is None:
            raise ValueError("the old-log-prob pass must run before an update (batch.logp_old is None)")
        inputs = LossInputs(logp, micro.logp_old, micro.logp_rollout, micro.advantages, micro.mask, micro.group_ids,
                            check_nan=self.check_nan)
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
    (``minirl.algo.entropy``; ``normalizer``: the mini-batch's trained tokens, so micro-batch losses add
    up to it). ``wants_entropy``: the trainer passes the differentiable entropy of each forward."""

    objective: Objective
    entropy_coef: float
    normalizer: float
    wants_entropy: bool = True

    def __call__(self, logp: torch.Tensor, micro: Batch, *, entropy: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        if entropy is None:
            raise ValueError("algo.entropy_coef > 0 needs the forward's entropy (objective(logp, micro, entropy=...))")
        loss, metrics = self.objective(logp, micro)
        bonus, entropy_metrics = entropy_bonus_loss(entropy, micro.mask, entropy_coef=self.entropy_coef,
                                                    normalizer=self.normalizer)
        return loss + bonus, {**metrics, **entropy_metrics}


def with_entropy_bonus(algo: AlgoConfig, minibatch: Batch, objective: Objective) -> Objective:
    """``objective`` with the entropy bonus when ``algo.entropy_coef`` > 0, else ``objective`` itself."""
    if not algo.entropy_coef:
        return objective
    return EntropyBonus(objective, float(algo.entropy_coef), float(max(int(minibatch.mask.sum()), 1)))
