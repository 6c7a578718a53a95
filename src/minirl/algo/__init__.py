"""The paper's math as pure torch functions: tensors in, ``(loss, metrics)`` out.

MiniRL is Eq. (7) of arXiv:2512.01374 ([P]); GRPO and CISPO follow [P] Appendix A; GSPO follows
arXiv:2507.18071, SAPO arXiv:2511.20347. No config objects, no logging, no I/O. Every log-prob argument follows the
names of ``minirl.types``: ``logp_rollout`` (mu_old, rollout engine), ``logp_old`` (pi_old,
trainer at theta_old), ``logp`` (pi_theta, with gradient).

``POLICY_LOSSES`` maps a loss name to a function of one validated input object (``LossInputs``,
checked once when it is built) and the loss's knobs; it returns the loss and its metrics as
detached 0-dim tensors (``to_floats`` converts them all with one host sync)::

    inputs = LossInputs(logp, logp_old, logp_rollout, advantages, mask, group_ids)
    loss, metrics = POLICY_LOSSES[name](inputs, **knobs)

Outside minirl, call a loss the same way (``minirl_loss(LossInputs(...), eps_high=0.27)``). Every loss
raises ``ValueError`` naming a bad argument or knob, and ``FloatingPointError`` on a NaN in
``advantages`` or at a trained token of a log-prob input. Knobs are keyword-only (an unknown one
is a ``TypeError``); CISPO also reads ``group_ids``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minirl.algo.advantages import group_advantages
from minirl.algo.cispo import cispo_loss
from minirl.algo.grpo import grpo_loss
from minirl.algo.gspo import gspo_loss
from minirl.algo.logprobs import token_logprobs
from minirl.algo.minirl import minirl_loss
from minirl.algo.variants.sapo import sapo_loss
from minirl.algo.variants.vespo import vespo_loss
from minirl.loss_inputs import LossInputs
from minirl.tensors import to_floats

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

POLICY_LOSSES: dict[str, PolicyLoss] = {"minirl": minirl_loss, "grpo": grpo_loss, "cispo": cispo_loss, "gspo": gspo_loss,
                                         "sapo": sapo_loss, "vespo": vespo_loss}

__all__ = [
    "POLICY_LOSSES", "LossInputs", "PolicyLoss", "cispo_loss", "group_advantages", "grpo_loss", "gspo_loss",
    "minirl_loss", "sapo_loss", "to_floats", "token_logprobs", "vespo_loss",
]
