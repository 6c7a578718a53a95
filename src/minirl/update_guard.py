"""A good update or none: the optimizer step is checked, and undone when it poisons the weights.

A finite gradient can still make non-finite or exploding weights (a learning rate of ``inf`` or
``1e30``, an overflow in low precision). ``UpdateGuard`` keeps a copy of the parameters and the
optimizer state taken just before ``optimizer.step()``; after it, one fused norm over all
parameters (``torch.nn.utils.get_total_norm``: ``torch._foreach_norm`` per device and dtype, the
global norm over FSDP2 shards, so every rank decides alike) tells whether the weights are still
finite and did not grow more than ``MAX_NORM_GROWTH`` times in one update. If not, ``restore``
puts the copy back bit for bit: the update is skipped as a non-finite gradient is
(``Trainer._skip``), and no checkpoint ever holds such weights.

The copy costs one more set of parameters and optimizer moments in memory, written once per
update (``benchmarks/bench_robustness.py`` measures the time, BENCHMARKS.md). Where that memory is
not there (a large model on one GPU), ``optim.update_guard: check`` keeps no copy: the same norm is
checked after the step, and a poisoned step, which then cannot be undone, stops the run at once
(``PoisonedWeights``, exit code 3) before any checkpoint could hold it; ``off`` checks nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch

GUARD_MODES: tuple[str, ...] = ("undo", "check", "off")
"""``optim.update_guard``: undo a poisoned step (a copy), check only (stop on one), or no check."""

MAX_NORM_GROWTH = 10.0
"""An update that multiplies the weights' global L2 norm by more than this is exploding (AdamW
moves each weight by about ``lr`` per update: at ``lr <= 1`` on weights of RMS >= 0.1, under 10x)."""


def total_norm(tensors: list[torch.Tensor]) -> float:
    """The global L2 norm of ``tensors`` (fused per device and dtype; over all shards of a DTensor)."""
    if not tensors:
        return 0.0
    norm = torch.nn.utils.get_total_norm([t.detach() for t in tensors], foreach=True)
    full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor holding this rank's partial norm
    return float(full() if full is not None else norm)


class NumericalFaultStop(RuntimeError):
    """The run stops for numerical faults (``optim.max_consecutive_faults`` updates in a row skipped, or
    a poisoned step that could not be undone); ``str()`` is one line. Exit code 3 in the CLI."""


class PoisonedWeights(NumericalFaultStop):
    """An optimizer step left non-finite or exploding weights and ``optim.update_guard=check`` kept no
    copy to undo it with."""


class UpdateGuard:
    """``snapshot()`` before ``optimizer.step()``, ``check()`` after it, ``restore()`` on a fault
    (``mode`` one of ``GUARD_MODES``; ``can_undo`` is False unless it is ``undo``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, mode: str = "undo") -> None:
        if mode not in GUARD_MODES:
            raise ValueError(f"update guard mode must be one of {GUARD_MODES}, got {mode!r}")
        self.mode = mode
        self.can_undo = mode == "undo"
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self._weights: list[torch.Tensor] | None = None
        self._state: list[dict[str, Any] | None] = []
        self._norm_before = 0.0

    @torch.no_grad()
    def snapshot(self) -> None:
        """Copy the parameters and their optimizer state (buffers reused from one update to the next);
        with ``check``, only their norm."""
        if self.mode != "undo":
            self._norm_before = total_norm(self.params) if self.mode == "check" else 0.0
            return
        if self._weights is None:
            self._weights = [p.detach().clone() for p in self.params]
        else:
            _copy_all(self._weights, [p.detach() for p in self.params])
        previous = self._state
        self._state = []
        for index, p in enumerate(self.params):
            state = self.optimizer.state.get(p)
            if not state:
                self._state.append(None)  # no state yet (first update): a restore removes it again
                continue
            old = previous[index] if index < len(previous) else None
            kept = old if old is not None else {}
            copy: dict[str, Any] = {}
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    buffer = kept.get(key)
                    if isinstance(buffer, torch.Tensor) and buffer.shape == value.shape and buffer.dtype == value.dtype:
                        copy[key] = buffer.copy_(value)
                    else:
                        copy[key] = value.detach().clone()
                else:
                    copy[key] = value
            self._state.append(copy)
        self._norm_before = total_norm(self._weights)

    def check(self) -> str | None:
        """Why the weights after the step are not usable (one phrase), or None."""
        if self.mode == "off":
            return None
        norm = total_norm(self.params)
        if not math.isfinite(norm):
            return f"non-finite weights after the optimizer step (norm {norm})"
        if self._norm_before > 0 and norm > MAX_NORM_GROWTH * self._norm_before:
            return f"exploding update (weight norm {self._norm_before:.4g} -> {norm:.4g} in one step)"
        return None

    @torch.no_grad()
    def restore(self) -> None:
        """The parameters and optimizer state as they were at ``snapshot()``, bit for bit."""
        assert self._weights is not None, "restore() before snapshot()"
        _copy_all([p.detach() for p in self.params], self._weights)
        for p, saved in zip(self.params, self._state):
            if saved is None:
                self.optimizer.state.pop(p, None)
                continue
            state = self.optimizer.state[p]
            for key, value in saved.items():
                if isinstance(value, torch.Tensor):
                    state[key].copy_(value)
                else:
                    state[key] = value


def _copy_all(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``destination.copy_(source)`` for each pair: one fused copy for plain tensors, one copy each for
    tensor subclasses (FSDP2's DTensor shards have no fused copy)."""
    if all(type(t) is torch.Tensor for t in (*destinations, *sources)):
        torch._foreach_copy_(destinations, sources)
        return
    for destination, source in zip(destinations, sources):
        destination.copy_(source)
