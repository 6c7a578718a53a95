"""From the ``algo`` config to the callable the trainer differentiates.

The trainer calls ``objective(logp, micro_batch)`` once per micro-batch and sums the gradients,
so each micro-batch's loss is scaled to its share of the mini-batch: the accumulated gradient
equals the gradient of the loss over the whole mini-batch (the normaliser of ``seq_sum`` is the
number of responses in the *mini-batch*, not in the micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minirl.algo import minirl_loss
from minirl.config import MiniRLConfig
from minirl.types import Batch

Objective = Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, float]]]


def make_objective(algo: MiniRLConfig, minibatch: Batch) -> Objective:
    """The MiniRL loss (paper Eq. 7, with the configured ablations) for micro-batches of ``minibatch``."""
    minibatch_sequences = minibatch.size
    minibatch_tokens = max(int(minibatch.mask.sum()), 1)

    def objective(logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        if micro.logp_old is None:
            raise ValueError("the old-log-prob pass must run before an update (batch.logp_old is None)")
        normalizer = None
        if algo.aggregation == "seq_sum":
            normalizer = algo.normalizer if algo.normalizer is not None else float(minibatch_sequences)
        loss, metrics = minirl_loss(
            logp,
            micro.logp_old,
            micro.logp_rollout,
            micro.advantages,
            micro.mask,
            eps_low=algo.eps_low,
            eps_high=algo.eps_high,
            clip=algo.clip,
            is_correction=algo.is_correction,
            tis_cap=algo.tis_cap,
            tis_placement=algo.tis_placement,
            aggregation=algo.aggregation,
            normalizer=normalizer,
        )
        if algo.aggregation == "seq_mean":
            loss = loss * (micro.size / minibatch_sequences)
        elif algo.aggregation == "token_mean":
            loss = loss * (int(micro.mask.sum()) / minibatch_tokens)
        return loss, {key: float(value) for key, value in metrics.items() if key != "loss"}

    return objective
