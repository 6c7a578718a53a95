"""How good is the first-order approximation? Pure measurements of [P] §2.3 (arXiv:2512.01374).

[P] optimises the token-level surrogate, Eq. (3)-(4), in place of the true sequence-level
objective, Eq. (1)-(2). With 1 + delta_t = pi_theta(y_t) / mu_old(y_t),

    pi_theta(y|x) / mu_old(y|x) = prod_t (1 + delta_t) = 1 + sum_t delta_t + O(delta^2)      ([P] §2.3)

so grad J_token = grad J_seq only while the dropped second-order terms are small, i.e. while
pi_theta stays close to mu_old. By Eq. (5) the token ratio factors into the training–inference
discrepancy pi_old / mu_old and the policy staleness pi_theta / pi_old. The functions here
measure those quantities on a batch; ``minirl.monitor.diagnostics`` runs them during training.

* ``first_order_residual``: per response, |prod_t (1 + delta_t) - (1 + sum_t delta_t)|, the
  size of what [P] §2.3 drops, in total and split by the two factors of Eq. (5).
* ``importance_weight_stats``: effective sample size and chi^2 of the training–inference
  weights pi_old / mu_old, per token (the weights of Eq. (4)) and per sequence (Eq. (2)); the
  chi^2 definitions match verl's ``rollout_corr/chi2_token`` and ``rollout_corr/chi2_seq``.
* ``sequence_is_loss``: a loss whose gradient is Eq. (2) itself (sequence-level IS), to compare
  gradients with.
* ``cosine``: cosine similarity of two flat gradient vectors.

Conventions: tensors in, python floats out (``sequence_is_loss`` returns a differentiable loss
too); statistics are over mask=True tokens, and a response (row) with no mask=True token is
skipped; an empty selection gives 0.0, never NaN (as in ``minirl.monitor.mismatch``). NaN inputs
at mask=True tokens are not raised on by the metrics: they propagate into the numbers, where they
are visible. Metric arithmetic runs in float64 on detached inputs.
"""

from __future__ import annotations

import math

import torch

from minirl.loss_inputs import LossInputs, check_knobs
from minirl.tensors import compute_dtype, masked, to_floats

# verl clamps log IS ratios to [-20, 20] before exponentiating its chi^2 metrics
# (SAFETY_BOUND in verl/trainer/ppo/rollout_corr_helper.py); we do the same so the numbers match.
SAFETY_BOUND: float = 20.0

RESIDUAL_PARTS: tuple[str, ...] = ("total", "train_infer", "staleness")
RESIDUAL_STATS: tuple[str, ...] = ("mean", "p50", "p90", "max")


def _check_same_shape(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        raise ValueError(f"mask must be a 2-D bool tensor [B, T], got {getattr(mask, 'shape', type(mask))}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = counted), got dtype {mask.dtype}")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.shape != mask.shape:
            raise ValueError(f"{name} must have the shape of mask {tuple(mask.shape)}, got {getattr(t, 'shape', type(t))}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def _log_ratio(num: torch.Tensor, den: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float64 ``num - den`` (detached) with 0 where mask is False (padding never enters exp)."""
    return masked(num.detach().double() - den.detach().double(), mask, torch.float64)


def _abs_gap_per_row(log_r: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """|prod_t r_t - (1 + sum_t (r_t - 1))| for the rows with tokens, r_t = exp(log_r).

    In log space: prod_t r_t - 1 = expm1(sum_t log r_t), and r_t - 1 = expm1(log r_t), so no
    "1 + small - 1" cancellation; masked positions have log r = 0 and contribute 0 to both sums.
    """
    gap = torch.expm1(log_r.sum(dim=1)) - torch.expm1(log_r).sum(dim=1)
    return gap[rows].abs()


def _summary(values: torch.Tensor) -> dict[str, torch.Tensor]:
    if values.numel() == 0:
        zero = torch.zeros((), dtype=torch.float64)
        return {stat: zero for stat in RESIDUAL_STATS}
    q = torch.quantile(values, torch.tensor([0.5, 0.9], dtype=values.dtype, device=values.device))
    return {"mean": values.mean(), "p50": q[0], "p90": q[1], "max": values.max()}


def first_order_residual(
    logp: torch.Tensor, logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """What the first-order approximation of [P] §2.3 drops, per response.

    For each response i, with 1 + delta_t = pi_theta(y_t) / mu_old(y_t) over its mask=True
    tokens, the residual is

        gap_i = prod_t (1 + delta_t) - (1 + sum_t delta_t)      (= sum_{s<t} delta_s delta_t + O(delta^3))

    computed in log space (prod_t (1 + delta_t) = exp(sum_t (logp - logp_rollout))). The same gap
    is computed for each factor of Eq. (5) on its own: the training–inference part with
    1 + delta_t = pi_old / mu_old (``logp_old - logp_rollout``) and the staleness part with
    1 + delta_t = pi_theta / pi_old (``logp - logp_old``). The parts do not add up to the total
    (the factors multiply).

    Reading: |gap| ~ ((sum delta)^2 - sum delta^2) / 2 grows quadratically with the per-token
    drift and with the length of the response. Near 0 the token-level surrogate's weight
    1 + sum delta is the sequence weight of Eq. (1); once p90/max reach ~0.1 the dropped terms
    are as large as the first-order ones for those responses. The training–inference part is
    fixed at rollout time (engine precision, routing mismatch: R3 lowers it); the staleness part
    is 0 on the first mini-batch of a step and grows over the N updates (clipping and R2/R3
    bound it). A float64 overflow (sum of log-ratios above ~709) gives ``inf``, honestly.

    Args:
        logp: float [B, T], log pi_theta (detached here).
        logp_old: float [B, T], log pi_old.
        logp_rollout: float [B, T], log mu_old.
        mask: bool [B, T], True = counted.

    Returns:
        ``residual/{part}_{stat}`` for part in ``total``, ``train_infer``, ``staleness`` and stat
        in ``mean`` (mean |gap| over responses), ``p50``, ``p90`` (linear-interpolated quantiles
        of |gap|), ``max``. Responses without tokens are skipped; no responses gives 0.0.
    """
    _check_same_shape(mask, logp=logp, logp_old=logp_old, logp_rollout=logp_rollout)
    rows = mask.any(dim=1)
    parts = {
        "total": _log_ratio(logp, logp_rollout, mask),
        "train_infer": _log_ratio(logp_old, logp_rollout, mask),
        "staleness": _log_ratio(logp, logp_old, mask),
    }
    metrics: dict[str, torch.Tensor] = {}
    for part, log_r in parts.items():
        for stat, value in _summary(_abs_gap_per_row(log_r, rows)).items():
            metrics[f"residual/{part}_{stat}"] = value
    return to_floats(metrics)


def _normalized_ess(log_w: torch.Tensor) -> torch.Tensor:
    """(sum w)^2 / (n sum w^2) from log-weights, exactly and without overflow; 0 if n = 0."""
    n = log_w.numel()
    if n == 0:
        return torch.zeros((), dtype=torch.float64)
    return torch.exp(2 * torch.logsumexp(log_w, dim=0) - math.log(n) - torch.logsumexp(2 * log_w, dim=0))


def _chi2(log_w: torch.Tensor) -> torch.Tensor:
    """verl's chi^2 estimate E[rho^2] - 1, rho = exp(clamp(log w, +-SAFETY_BOUND)); 0 if empty."""
    if log_w.numel() == 0:
        return torch.zeros((), dtype=torch.float64)
    rho = torch.exp(log_w.clamp(min=-SAFETY_BOUND, max=SAFETY_BOUND))
    return rho.square().mean() - 1.0


def importance_weight_stats(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Spread of the training–inference IS weights w = pi_old / mu_old ([P] Eq. (5), first factor).

    Token weights w_t (the weights of Eq. (4)) over all mask=True tokens, and sequence weights
    W_i = prod_t w_t (the weight of Eq. (1)-(2)) over responses with at least one token:

        is/ess_token   (sum_t w_t)^2 / (n sum_t w_t^2),  n = number of tokens       in (0, 1]
        is/ess_seq     (sum_i W_i)^2 / (m sum_i W_i^2),  m = number of responses   in (0, 1]
        is/chi2_token  mean_t rho_t^2 - 1,  rho_t = exp(clamp(log w_t, +-20))
        is/chi2_seq    mean_i rho_i^2 - 1,  rho_i = exp(clamp(sum_t log w_t, +-20))

    The chi^2 estimates are verl's ``rollout_corr/chi2_token`` and ``rollout_corr/chi2_seq``
    (``compute_offpolicy_metrics`` in verl/trainer/ppo/rollout_corr_helper.py: token-level
    masked mean of rho^2 minus 1; sequence-level mean over sequences of exp(2 * sum log rho)
    minus 1, both with log rho clamped to +-20). Two differences: verl averages chi2_seq over all
    rows, we skip rows without tokens; and verl's ``rollout_is_eff_sample_size`` is computed on
    weights clamped to [1/C, C] (its IS threshold C), while the ESS here is of the raw weights,
    evaluated exactly in log space (no clamp, no overflow).

    Reading: ESS/n is the fraction of samples that effectively carry the weighted average; 1
    means all weights equal (no mismatch), 1/n means one sample dominates. chi^2 = E[w^2] - 1 is
    the variance of the weights when their mean is 1 (ESS/n ~ 1 / (1 + chi^2)); 0 on-policy.
    Token-level numbers stay near 1 / 0 under a small engine mismatch; sequence-level ones
    degrade exponentially with response length, which is why Eq. (2) is "intractable" and the
    token-level surrogate is used ([P] §2.2). A falling ``is/ess_seq`` also means the sequence
    gradient of ``sequence_is_loss`` (and hence ``fidelity/grad_cosine``) rests on few responses.

    Args:
        logp_old: float [B, T], log pi_old.
        logp_rollout: float [B, T], log mu_old.
        mask: bool [B, T], True = counted.
    """
    _check_same_shape(mask, logp_old=logp_old, logp_rollout=logp_rollout)
    log_w = _log_ratio(logp_old, logp_rollout, mask)
    log_w_token = log_w[mask]
    log_w_seq = log_w.sum(dim=1)[mask.any(dim=1)]
    return to_floats(
        {
            "is/ess_token": _normalized_ess(log_w_token),
            "is/ess_seq": _normalized_ess(log_w_seq),
            "is/chi2_token": _chi2(log_w_token),
            "is/chi2_seq": _chi2(log_w_seq),
        }
    )


def sequence_is_loss(
    logp: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The sequence-level IS loss: its gradient is [P] Eq. (2) (negated), with advantages for R.

        loss = -(1/N) sum_i sg[W_i] * A_i * sum_t logp_{i,t},   W_i = exp(sum_t (logp - logp_rollout)_{i,t})

    sums over mask=True tokens, N = ``normalizer`` or B. So grad loss = -(1/N) sum_i W_i A_i
    sum_t grad log pi_theta(y_t): the REINFORCE estimator with the full sequence weight
    pi_theta(y) / mu_old(y), which the token-level surrogate (Eq. (4), MiniRL Eq. (7))
    approximates to first order. No clipping, no truncation: it is the reference the surrogate is
    compared against, not a loss to train with (its variance is why [P] does not). W is computed
    in float64 and then cast to the loss dtype (float32 for float32/bf16 logp), where it
    overflows to inf beyond ~88 nats of summed log-ratio.

    Args:
        logp: float [B, T], log pi_theta; the only input that gets gradient.
        logp_rollout: float [B, T], log mu_old; constant.
        advantages: float [B]; constant.
        mask: bool [B, T], True = trained on.
        normalizer: the loss's denominator (pass the mini-batch's B when accumulating
            micro-batches); ``None`` means this batch's B.

    Returns:
        ``(loss, metrics)``; metrics ``loss``, ``seq_weight_mean`` and ``seq_weight_max`` (W over
        responses with tokens; 0.0 if none).

    Raises:
        ValueError: bad argument. FloatingPointError: NaN in advantages or at a trained token.
    """
    check_knobs(normalizer=normalizer)
    if advantages.ndim != 1:
        raise ValueError(f"advantages must have shape [B] (one per response: the sequence-level objective), got "
                         f"{tuple(advantages.shape)}")
    LossInputs(logp, logp, logp_rollout, advantages, mask).raise_on_nan()
    dtype = compute_dtype(logp)
    logp_m = masked(logp, mask, dtype)  # gradient flows here only, 0 at padding
    log_w = _log_ratio(logp, logp_rollout, mask).sum(dim=1)  # float64, detached
    weight = torch.exp(log_w).to(dtype)
    adv = advantages.detach().to(dtype)
    denom = logp.shape[0] if normalizer is None else normalizer
    loss = -(weight * adv * logp_m.sum(dim=1)).sum() / denom
    rows = mask.any(dim=1)
    w_rows = torch.exp(log_w[rows])
    zero = torch.zeros((), dtype=torch.float64)
    return loss, to_floats(
        {
            "loss": loss,
            "seq_weight_mean": w_rows.mean() if w_rows.numel() else zero,
            "seq_weight_max": w_rows.max() if w_rows.numel() else zero,
        }
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity <a, b> / (|a| |b|) of two gradient vectors (flattened), in float64.

    Returns a python float in [-1, 1] (rounding is clamped). A zero vector has no direction, so
    a zero norm gives ``nan`` (not 0, which would read as "orthogonal"); so does any non-finite
    entry. Raises ``ValueError`` if the sizes differ.
    """
    if a.numel() != b.numel():
        raise ValueError(f"cosine of vectors of different sizes: {a.numel()} and {b.numel()}")
    x = a.detach().reshape(-1).double()
    y = b.detach().reshape(-1).double()
    norm = torch.linalg.vector_norm(x) * torch.linalg.vector_norm(y)
    value = float(torch.dot(x, y) / norm) if float(norm) > 0 else math.nan
    return value if not math.isfinite(value) else min(1.0, max(-1.0, value))
