"""Is the token-level surrogate still the sequence-level gradient? Measured during training.

[P] (arXiv:2512.01374) §2.3 justifies optimising the token-level surrogate J_token, Eq. (3)-(4),
by a first-order approximation of the true objective J_seq, Eq. (1)-(2), that holds only while
pi_theta stays close to the rollout policy mu_old; Eq. (5) splits the distance into the
training–inference discrepancy (pi_old / mu_old) and the policy staleness (pi_theta / pi_old).
This module makes that claim measurable on a mini-batch, cheaply enough to run every k steps on
small models: two extra forward/backward passes for ``gradient_fidelity``, none for
``approximation_metrics``.

How to call it from an outer loop, for a mini-batch ``mb`` about to be updated on::

    objective = make_objective(cfg.algo, mb)
    metrics.update(gradient_fidelity(trainer, mb, objective, replay_routes=replay, tag="first"))
    metrics.update(approximation_metrics(logp_now, mb, tag="first"))   # logp_now: pi_theta on mb
    trainer.update(mb, objective, replay_routes=replay)

(``gradient_fidelity(..., approximation=True)`` returns both sets, reusing its own forward pass
for ``logp_now``.) Called before the first mini-batch of a step, pi_theta = pi_old, so only the
training–inference factor is at work; before the last of N > 1 mini-batches, N - 1 updates of
staleness are added. Comparing ``first`` and ``last`` shows the approximation decay with
staleness.

The diagnostics, and how to read them:

``fidelity/grad_cosine``
    Cosine between the gradient the trainer actually follows (the surrogate objective passed in,
    with its clipping mask, TIS truncation and normaliser, MiniRL Eq. (7) by default) and the
    gradient of the sequence-level IS objective of Eq. (2) (``sequence_is_loss``: full sequence
    weight pi_theta(y) / mu_old(y), no clipping) on the same mini-batch with the same
    advantages. 1 means the two point the same way: the first-order approximation holds here.
    On-policy with an exact engine and MiniRL's sequence-sum aggregation it is 1 up to rounding;
    training–inference mismatch (low-precision engine, routing mismatch) and staleness lower it.
    A surrogate with per-response length normalisation (GRPO, ``aggregation="seq_mean"``) is
    below 1 even on-policy, the bias [P] §4.3 points out. A constant normaliser (1/B, 1/#tokens)
    does not change it. Caveat: the Eq. (2) gradient is itself a noisy single-batch estimate
    whose weights can be dominated by a few responses; read it together with ``is/ess_seq``.
``fidelity/grad_norm_surrogate``, ``fidelity/grad_norm_seq``
    The L2 norms of the two gradients (before any clipping); their ratio says whether the
    surrogate under- or over-steps the true gradient (the cosine ignores magnitude).
``fidelity/grad_rel_err``
    |g_surrogate - g_seq| / |g_seq|: direction and magnitude error in one number; 0 is exact,
    ~sqrt(2 - 2 cos) when the norms agree.
``residual/{total,train_infer,staleness}_{mean,p50,p90,max}``
    Per response, |prod_t (1 + delta_t) - (1 + sum_t delta_t)|: the terms [P] §2.3 drops, for
    the full ratio pi_theta / mu_old and for each factor of Eq. (5). ~0 means the surrogate's
    weight is the sequence weight; it grows quadratically with the per-token drift and with the
    response length, and p90/max near 0.1 mean the approximation is gone for those responses.
    ``train_infer`` is fixed at rollout (R3 and engine precision act on it); ``staleness`` is 0
    on the first mini-batch and grows with each update (clipping and R2/R3 bound it).
``is/ess_token``, ``is/ess_seq``, ``is/chi2_token``, ``is/chi2_seq``
    Normalised effective sample size (ESS/n in (0, 1]) and chi^2 = E[w^2] - 1 (verl's
    ``rollout_corr/chi2_*``) of the training–inference weights pi_old / mu_old, per token and
    per sequence. ESS 1 / chi^2 0: no mismatch; ESS near 1/n: a handful of samples dominate the
    weighted estimate. Sequence-level values degrade exponentially with length, the reason
    Eq. (2) is impractical and the token-level weights of Eq. (4) are used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minirl.monitor.fidelity import (
    cosine,
    first_order_residual,
    importance_weight_stats,
    sequence_is_loss,
)
from minirl.types import Batch

if TYPE_CHECKING:  # the trainer imports minirl.monitor.routing: no import cycle at run time
    from minirl.trainer import Objective, Trainer


def _key(name: str, tag: str | None) -> str:
    """``group/name`` -> ``group/{tag}_name`` (``fidelity/grad_cosine`` -> ``fidelity/first_grad_cosine``)."""
    if not tag:
        return name
    group, _, rest = name.partition("/")
    return f"{group}/{tag}_{rest}"


def sequence_objective(minibatch: Batch) -> Objective:
    """``sequence_is_loss`` (gradient = [P] Eq. (2)) as a trainer objective for ``minibatch``.

    Divides by the mini-batch's B, so micro-batch gradients add up to the mini-batch gradient (and the shards' of FSDP
    ranks to it; a dataclass, so it travels to the ranks).
    """
    return SequenceObjective(float(minibatch.size))


@dataclass(frozen=True)
class SequenceObjective:
    """``sequence_is_loss`` over a mini-batch of ``normalizer`` responses (``sequence_objective``)."""

    normalizer: float

    def __call__(self, logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        loss, _ = sequence_is_loss(logp, micro.logp_rollout, micro.advantages, micro.mask, normalizer=self.normalizer)
        return loss, {}


def gradient_fidelity(
    trainer: Trainer,
    minibatch: Batch,
    surrogate_objective: Objective,
    *,
    replay_routes: bool = False,
    tag: str | None = None,
    approximation: bool = False,
) -> dict[str, float]:
    """Cosine between the surrogate's gradient and the sequence-level gradient of [P] Eq. (2).

    Computes, with ``Trainer.gradient`` (no step; weights, optimizer, RNG and ``.grad`` left as
    they were), g_surrogate = grad of ``surrogate_objective`` (the objective about to be used for
    this mini-batch's update, e.g. ``make_objective(cfg.algo, minibatch)``) and g_seq = grad of
    ``sequence_is_loss`` on the same mini-batch and advantages, both with the same routing
    replay setting as the update. See the module docstring for how to read the numbers.

    Args:
        trainer: the trainer, at the parameters theta the next update starts from.
        minibatch: the mini-batch, with ``logp_old`` filled (the surrogate needs it).
        surrogate_objective: ``objective(logp, micro) -> (loss, metrics)`` as given to ``update``.
        replay_routes: as for ``update`` (True under R2/R3).
        tag: inserted after the group: ``tag="first"`` gives ``fidelity/first_grad_cosine``.
        approximation: also return ``approximation_metrics`` (same tag) for pi_theta on this
            mini-batch, with the log-probs of the sequence pass (no extra forward).

    Returns:
        ``fidelity/grad_cosine`` (nan if a gradient is zero or non-finite),
        ``fidelity/grad_norm_surrogate``, ``fidelity/grad_norm_seq``, ``fidelity/grad_rel_err``
        (nan if g_seq is zero); plus the ``residual/*`` and ``is/*`` keys if ``approximation``.
    """
    if minibatch.logp_old is None:
        raise ValueError("gradient_fidelity needs minibatch.logp_old (run the old-log-prob pass first)")
    g_surrogate = trainer.gradient(minibatch, surrogate_objective, replay_routes=replay_routes)
    seq_and_logp = trainer.gradient(minibatch, sequence_objective(minibatch), replay_routes=replay_routes, with_logp=True)
    assert isinstance(g_surrogate, torch.Tensor) and isinstance(seq_and_logp, tuple)  # with_logp picks the form
    g_seq, logp = seq_and_logp
    norm_surrogate = float(torch.linalg.vector_norm(g_surrogate.double()))
    norm_seq = float(torch.linalg.vector_norm(g_seq.double()))
    diff = float(torch.linalg.vector_norm(g_surrogate.double() - g_seq.double()))
    out = {
        "fidelity/grad_cosine": cosine(g_surrogate, g_seq),
        "fidelity/grad_norm_surrogate": norm_surrogate,
        "fidelity/grad_norm_seq": norm_seq,
        "fidelity/grad_rel_err": diff / norm_seq if norm_seq > 0 else math.nan,
    }
    out = {_key(k, tag): v for k, v in out.items()}
    if approximation:
        out.update(approximation_metrics(logp, minibatch, tag=tag))
    return out


def approximation_metrics(logp: torch.Tensor, batch: Batch, *, tag: str | None = None) -> dict[str, float]:
    """``first_order_residual`` and ``importance_weight_stats`` of ``batch`` at pi_theta = ``logp``.

    Args:
        logp: float [B, T], log pi_theta of ``batch``'s targets now (e.g.
            ``trainer.score(batch, replay_routes=..., entropy=False).logp``); any value at
            mask=False positions is ignored.
        batch: with ``logp_old`` (pi_old) and ``logp_rollout`` (mu_old).
        tag: inserted after the group: ``tag="last"`` gives ``residual/last_total_mean``.

    Returns:
        ``residual/{total,train_infer,staleness}_{mean,p50,p90,max}`` and
        ``is/{ess_token,ess_seq,chi2_token,chi2_seq}``; see ``minirl.monitor.fidelity``.
    """
    if batch.logp_old is None:
        raise ValueError("approximation_metrics needs batch.logp_old (run the old-log-prob pass first)")
    out = first_order_residual(logp, batch.logp_old, batch.logp_rollout, batch.mask)
    out.update(importance_weight_stats(batch.logp_old, batch.logp_rollout, batch.mask))
    return {_key(k, tag): v for k, v in out.items()}
