"""The trainer: owns the model and the optimizer; knows nothing about which objective runs.

Two entry points, both over a ``Batch`` laid out by ``minirl.batching``:

* ``score``: a no-gradient pass returning per-target log-probs (``logp_old`` at theta_old), the
  full-vocabulary entropy at the rollout prefixes, and optionally the routes the trainer chose
  (R2 records them here). Given routes, it replays them (R3 replays the engine's routes here).
* ``update``: one gradient update on a mini-batch: micro-batches of ``micro_batch_sequences``
  rows (or, with ``micro_batch_max_tokens``, rows of similar length up to a token budget: the
  padding of one right-padded batch is not computed), gradient accumulation, gradient-norm
  clipping, AdamW and the learning-rate schedule.
  With ``padding_free`` (``optim.padding_free``) every forward runs on the micro-batch's real tokens
  only (``minirl.models.padding_free``); log-probs come back [B, T] as before. With ``shared_prompt``
  (``optim.shared_prompt``) rows of a micro-batch with the same prompt also pack it once.
  The caller passes ``objective(logp, micro_batch) -> (loss, metrics)``; the trainer only
  differentiates what it is given.

Routing replay is an explicit object (``minirl.moe.RoutingReplay``), used only when the batch
carries routes and the caller asks for them to be replayed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from minirl.algo import to_floats, token_logprobs
from minirl.algo.logprobs import token_entropy_with_grad
from minirl.batching import micro_batches
from minirl.loss_inputs import nan_report
from minirl.models.logprob_head import LogprobHead
from minirl.models.lora import merged_state_dict
from minirl.models.padding_free import Packing, packed_forward
from minirl.monitor.mismatch import token_entropy, token_sum_pi_squared
from minirl.monitor.routing import route_diff_counts
from minirl.precision import LossScale, autocast_experts, compute_context
from minirl.types import Batch, to_device
from minirl.update_guard import PoisonedWeights, UpdateGuard

Objective = Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, torch.Tensor | float]]]
"""``objective(logp, micro_batch) -> (loss, metrics)``: metrics as 0-dim tensors (or floats); the
trainer converts them, the loss and the gradient norm to python floats with one host sync."""


@dataclass
class ScoreResult:
    logp: torch.Tensor  # [B, T] float32
    entropy: torch.Tensor | None  # [B, T] float32
    routes: torch.Tensor | None  # [B, S, L, K] int16: the trainer's own (natural) routes, -1 at padding
    sum_pi_squared: torch.Tensor | None = None  # [B, T] float32: sum_w pi(w)^2 at each prefix (``score``'s option)


@dataclass(frozen=True)
class UpdateResult:
    """What one ``Trainer.update`` did. ``fault`` set: the update was skipped (no optimizer step, the
    reason in one line); loss, norm, lr and metrics are then empty."""

    loss: float = 0.0  # the mini-batch loss (summed over micro-batches)
    grad_norm: float = 0.0  # before clipping
    lr: float = 0.0  # the learning rate this step used
    metrics: dict[str, float] = field(default_factory=dict)  # the objective's, over the whole mini-batch
    natural_diff_frac: float | None = None  # ``natural_drift``: replayed vs the router's own top-k sets
    scores: ScoreResult | None = None  # ``score``/``old_pass``: pi_old from this update's forward
    fault: str | None = None
    metric_inputs: MetricInputs | None = None  # ``Trainer.share_metric_inputs``: what ``metrics`` are computed from
    loss_scale: float | None = None  # optim.precision=fp16: the loss scale after this update (``LossScale``)
    overflowed: bool = False  # fp16: skipped for a gradient overflow (the scale halved), not a numerical fault


@dataclass
class MetricInputs:
    """What an update's metrics are computed from, over its whole mini-batch: the detached float32 log-probs
    [B, T-1] (0 at padding), pi_theta's entropy where the objective ``wants_entropy``, and R2's counts of fed
    (token, layer) pairs whose replayed top-k set differs from the router's own (``natural_drift``).

    Token means and maxima over the whole mini-batch are not the mean of the shards' own: an FSDP rank
    (``Trainer.share_metric_inputs``) returns its shard's inputs and the group computes the metrics of the rows
    joined back, the numbers one process reports."""

    logp: torch.Tensor
    entropy: torch.Tensor | None = None
    route_pairs: tuple[torch.Tensor, torch.Tensor] | None = None  # (differing, counted), integer tensors

    def metrics(self, objective: Objective, minibatch: Batch) -> dict[str, Any]:
        """``objective``'s metrics over ``minibatch`` (0-dim tensors on ``logp``'s device), and R2's drift."""
        with torch.no_grad():
            given = {} if self.entropy is None else {"entropy": self.entropy}
            totals = dict(objective(self.logp, minibatch.to(self.logp.device), **given)[1])
        if self.route_pairs is not None:  # a tensor: synced with the update's other numbers (exact integer counts)
            differing, counted = self.route_pairs
            totals["routing_natural_diff_frac"] = differing.double() / counted.double().clamp(min=1)
        return _as_tensors(totals, self.logp)

    def cpu(self) -> MetricInputs:
        pairs = None if self.route_pairs is None else (self.route_pairs[0].cpu(), self.route_pairs[1].cpu())
        return MetricInputs(self.logp.cpu(), None if self.entropy is None else self.entropy.cpu(), pairs)

    @staticmethod
    def joined(parts: Sequence[MetricInputs]) -> MetricInputs:
        """The inputs of contiguous shards, joined back in row order (the shards keep the batch's width)."""
        pairs = None
        if parts[0].route_pairs is not None:
            counts = [p.route_pairs for p in parts if p.route_pairs is not None]
            pairs = (torch.stack([c[0] for c in counts]).sum(), torch.stack([c[1] for c in counts]).sum())
        entropy = None if parts[0].entropy is None else torch.cat([p.entropy for p in parts])  # type: ignore[misc]
        return MetricInputs(torch.cat([p.logp for p in parts]), entropy, pairs)


class Wraps:
    """A wrapper of an objective (its ``objective``) asks the trainer for what the objective inside wants of each
    forward: pi_theta's differentiable entropy (``wants_entropy``, an entropy bonus or token selection) and the
    router logits (``wants_router_logits``, the load-balancing loss)."""

    objective: Any

    @property
    def wants_entropy(self) -> bool:
        return bool(getattr(self.objective, "wants_entropy", False))

    @property
    def wants_router_logits(self) -> bool:
        return bool(getattr(self.objective, "wants_router_logits", False))


@dataclass(frozen=True)
class OnPolicy(Wraps):
    """An objective whose pi_old is the update's own forward, detached: with one update per global
    step (N = 1) theta_old *is* theta, so ``logp_old = logp.detach()`` is the old-log-prob pass, and
    the step skips that pass (TRL's GRPOTrainer does the same when it takes one step per generation).
    The ratio pi_theta/pi_old is exactly 1, the clipping mask keeps every token, and the IS weight
    pi_old/mu_old uses the same numbers the separate pass would give (the same forward)."""

    objective: Objective

    def __call__(self, logp: torch.Tensor, micro: Batch, **given: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        return self.objective(logp, micro.with_logp_old(logp.detach() * micro.mask), **given)


STOCHASTIC_ATTRS: tuple[str, ...] = (
    "attention_dropout", "hidden_dropout", "activation_dropout", "dropout", "jitter_noise", "router_jitter_noise",
    "resid_pdrop", "embd_pdrop", "attn_pdrop",
)


def disable_stochastic_layers(model: torch.nn.Module) -> int:
    """Turn off dropout and router jitter in ``model`` (returns how many settings were changed).

    The decision for RL (``Trainer(deterministic=True)``, the default): the old-log-prob pass
    scores in ``eval()`` mode and the updates run in ``train()`` mode (gradient checkpointing needs
    it), so a model with dropout or Mixtral's ``router_jitter_noise`` would compute a different,
    random function in each pass: r = pi_theta / pi_old != 1 at theta = theta_old, and R2 would
    record routes the updates never take. With every dropout probability and jitter at 0 both
    modes compute the same function and r = 1 exactly (TRL's ``disable_dropout`` does the same for
    its RL trainers). Only module attributes change; the model's config (saved with checkpoints)
    is left as the user wrote it.
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            module.p, changed = 0.0, changed + 1
        for attr in STOCHASTIC_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, float) and value > 0:
                setattr(module, attr, 0.0)
                changed += 1
    return changed


def lr_factor(update: int, warmup_updates: int = 0, total_updates: int = 0, schedule: str = "constant",
              min_ratio: float = 0.0) -> float:
    """The learning rate of 0-based ``update`` as a fraction of the base rate (``optim.lr_schedule``).

    Warm-up: (update + 1) / warmup_updates up to 1. After it, with progress p = (update - warmup_updates) /
    (total_updates - warmup_updates) clamped to [0, 1]: constant 1; linear min + (1 - min)(1 - p); cosine
    min + (1 - min)(1 + cos(pi p)) / 2 — transformers' ``get_linear_schedule_with_warmup`` /
    ``get_cosine_schedule_with_warmup`` after their warm-up, with verl's ``min_lr_ratio``.
    """
    if update < warmup_updates:
        return (update + 1) / warmup_updates
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (update - warmup_updates) / max(1, total_updates - warmup_updates)))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape


ADAMW_IMPLS: dict[str, dict[str, bool | None]] = {
    "default": {"foreach": None, "fused": None},  # torch's choice: foreach on CUDA, the for-loop on a CPU
    "for_loop": {"foreach": False, "fused": None},
    "foreach": {"foreach": True, "fused": None},
    "fused": {"foreach": None, "fused": True},  # one kernel per parameter (transformers' adamw_torch_fused)
}


def adamw_flags(impl: str) -> dict[str, bool | None]:
    """``torch.optim.AdamW``'s ``foreach`` / ``fused`` arguments for ``optim.adamw_impl``."""
    if impl not in ADAMW_IMPLS:
        raise ValueError(f"adamw_impl must be one of {', '.join(ADAMW_IMPLS)}, got {impl!r}")
    return dict(ADAMW_IMPLS[impl])


def keep_adamw_impl(optimizer: torch.optim.Optimizer, impl: str) -> None:
    """``Optimizer.load_state_dict`` restores the saved groups' ``foreach`` / ``fused`` flags with their
    hyperparameters: put this trainer's implementation back (a checkpoint stays loadable by any)."""
    for group in optimizer.param_groups:
        group.update(adamw_flags(impl))



def _positive_temperature(value: float) -> float:
    """``Trainer(logits_temperature=...)``, checked: a positive, finite divisor of the logits."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"logits_temperature must be a positive number (got {value})")
    return value

class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grad_clip_norm: float = 1.0,
        warmup_updates: int = 0,
        lr_schedule: str = "constant",
        total_updates: int = 0,
        min_lr_ratio: float = 0.0,
        micro_batch_sequences: int = 64,
        micro_batch_max_tokens: int | None = None,
        replay: Any | None = None,
        deterministic: bool = True,
        precision: str = "fp32",
        loss_scale: LossScale | None = None,
        update_guard: str = "undo",
        adamw_impl: str = "default",
        padding_free: bool = False,
        shared_prompt: bool = False,
        logprob_chunk_tokens: int | None = None,
        logits_temperature: float = 1.0,
        collective: bool = False,
    ) -> None:
        # Over 60 lines: one parameter and one assignment per optimizer and forward knob; split, they would scatter
        if deterministic:
            disable_stochastic_layers(model)
        self.model = model
        self.precision = precision  # the forward's compute (``minirl.precision``); weights stay as given
        self.loss_scale = loss_scale or LossScale(precision)  # fp16's dynamic loss scale; nothing for fp32 / bf16
        if precision != "fp32":
            autocast_experts(model)  # fused MoE experts in the autocast dtype too
        self.device = compute_device(model)  # batches live on the CPU; micro-batches move here
        self.replay = replay
        self.grad_clip_norm = grad_clip_norm
        self.micro_batch_sequences = micro_batch_sequences
        self.micro_batch_max_tokens = micro_batch_max_tokens
        # ``optim.padding_free``: forwards on the real tokens only; ``optim.shared_prompt`` (which packs too): each
        # prompt of a micro-batch once, its rows reading it in attention (``padding_free`` / ``shared_prompt`` below)
        self._packed = packed_forward(model, padding_free, shared_prompt)  # refuses a model in one line now
        # ``optim.logprob_chunk_tokens``: the forward stops at the hidden states; the head runs a chunk at a time
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.logits_temperature = _positive_temperature(logits_temperature)  # log pi of logits / T: the engine's law
        self.head = LogprobHead(model, logprob_chunk_tokens) if logprob_chunk_tokens else None
        if self.head is not None:
            self.head.check(self.device)  # refuses a model whose logits are not its head's, in one line
            reshard_all(model)  # FSDP2's root stays gathered after the check's forward: AdamW must hold the shards
        self.adamw_impl = adamw_impl
        flags = adamw_flags(adamw_impl)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            foreach=flags["foreach"], fused=flags["fused"],
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            lr_factor, warmup_updates=warmup_updates, total_updates=total_updates, schedule=lr_schedule,
            min_ratio=min_lr_ratio))
        self._guard = UpdateGuard(self.optimizer, update_guard)  # ``optim.update_guard``
        self.updates_done = self.consecutive_faults = 0
        self.faults = 0  # skipped updates (non-finite log-probs, loss, gradients or weights after the step)
        # a rank of an FSDP group (``minirl.distributed.rank``): every update runs every forward and backward, even on
        # bad inputs, so no collective waits for a rank that skipped alone, and token budgets agree across the ranks
        self.collective = collective
        self.share_metric_inputs = False  # a group's rank: updates also return MetricInputs (the group's metrics)

    # ------------------------------------------------------------------ forward passes

    def _logits(self, micro: Batch, replay_routes: bool, natural: list | None = None,
                block: ExitStack | None = None, router_logits: list | None = None) -> torch.Tensor:
        """Logits of ``micro``; with ``natural`` (a list) the routers' own top-k [B, S, L, K] of this
        forward is appended to it: captured under replay, else recorded. With ``block``, the routing
        block is entered on it and closes (appending to ``natural``) when the caller closes it,
        after its backward: gradient checkpointing recomputes the routers during backward. With
        ``router_logits`` (a list), the model's router logits (one [tokens, E] per MoE layer) go into it."""
        context: AbstractContextManager[Any] = nullcontext()
        # ``optim.padding_free``: the model sees the real tokens as one row [1, T]; routes in and out follow
        packing = None if self._packed is None else Packing.of(micro.attention_mask, self.device, self._packed.prompts(
            micro.input_ids, micro.mask, micro.routes if replay_routes else None))
        if replay_routes:
            if self.replay is None or micro.routes is None:
                raise ValueError("routing replay was requested but the trainer has no RoutingReplay or the batch no routes")
            routes = micro.routes.long() if packing is None else packing.pack(micro.routes.long())
            # a shared prompt's routes are replayed once for all its rows (the same routes: ``shared_prompts``)
            counted = micro.routes if packing is not None and packing.slots is not None else None
            context = self.replay.replay(routes, capture_natural=natural is not None, counted=counted)
        elif natural is not None:
            if self.replay is None:
                raise ValueError("recording routes needs an MoE model with a RoutingReplay")
            context = self.replay.record()
        with ExitStack() as own:
            stack, handles = block or own, list[Any]()
            if self.head is not None:  # the forward's "logits" are its final hidden states (``_token_terms``)
                own.enter_context(self.head.hidden_states())
            if natural is not None:  # registered first, so it runs after the routing block has closed
                sink = natural

                def append_routes() -> None:  # the handle's routes are filled when its block exits
                    if handles:
                        routes = handles[0].natural_routes if replay_routes else handles[0].routes
                        # (None when the forward was interrupted: the routing block closes on the way out)
                        sink.append(routes if packing is None or routes is None else packing.unpack(routes, fill=-1))

                stack.callback(append_routes)
            handles.append(stack.enter_context(context))
            with compute_context(self.precision, self.device):
                # Rows are right-padded, so the causal mask alone keeps real tokens from attending to
                # padding, and positions are plain arange: no attention mask needed (it costs ~3x in
                # the attention path). Padding positions' outputs are garbage and are masked out.
                input_ids = to_device(micro.input_ids, self.device)
                extra = {} if router_logits is None else {"output_router_logits": True}
                if self._packed is not None and packing is not None:  # zeros at padding
                    return self._packed(input_ids, packing, stack, use_cache=False, router_logits=router_logits, **extra)
                out = self.model(input_ids=input_ids, use_cache=False, **extra)
                if router_logits is not None:
                    router_logits.extend(out.router_logits)
                return out.logits

    @torch.no_grad()
    def score(self, batch: Batch, *, replay_routes: bool = False, record_routes: bool = False, entropy: bool = True,
              sum_pi_squared: bool = False) -> ScoreResult:
        """log pi(y_t) for every target position of ``batch`` without gradient (``logp_old``); with ``entropy`` and
        ``sum_pi_squared`` also each prefix's full-vocabulary entropy and sum_w pi(w)^2 (verl's optimal token baseline).

        ``record_routes``: also return the routes the trainer's routers pick by themselves
        (``ScoreResult.routes``): recorded, or, together with ``replay_routes``, captured per layer
        while the batch's routes are replayed (``RoutingReplay.replay(capture_natural=True)``).
        """
        self.model.eval()
        scores = _Scores(batch, entropy=entropy, device=self.device, sum_pi_squared=sum_pi_squared)
        for rows, micro in self._micro_batches(batch):
            rows = rows if isinstance(rows, slice) else to_device(rows, self.device)
            natural: list | None = [] if record_routes else None
            out = self._logits(micro, replay_routes=replay_routes, natural=natural)
            logp, entropies, squares = self._token_terms(out, micro, "detached" if entropy else None, sum_pi_squared)
            scores.add(rows, micro, logp, entropies, natural[0] if natural else None, squares)
        return scores.result()

    def _token_terms(self, out: torch.Tensor, micro: Batch, entropy: str | None, sum_pi_squared: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """log pi(y_t) [b, T-1] of ``micro``'s targets from a forward's ``out`` (logits [b, T, V], or with
        ``optim.logprob_chunk_tokens`` hidden states, through the chunked head at the completion tokens: ``micro``
        is then the host's copy, whose mask sizes the chunks without a device sync), with ``entropy``
        ``"detached"`` / ``"grad"`` the full-vocabulary entropy (differentiable with ``"grad"``), and with
        ``sum_pi_squared`` each prefix's sum_w pi(w)^2 (detached; else None)."""
        targets = to_device(micro.input_ids[:, 1:], self.device)
        if self.head is not None:
            return self.head.terms(out[:, :-1], targets, micro.mask, entropy,
                                   context=functools.partial(compute_context, self.precision, self.device),
                                   temperature=self.logits_temperature, sum_pi_squared=sum_pi_squared)
        logits = out[:, :-1].float()
        if self.logits_temperature != 1.0:  # (skipped at 1: the logits bitwise as they were)
            logits = logits / self.logits_temperature
        logp = token_logprobs(logits, targets)
        squares = token_sum_pi_squared(logits.detach()) if sum_pi_squared else None
        if entropy == "grad":
            return logp, token_entropy_with_grad(logits), squares
        return logp, None if entropy is None else token_entropy(logits.detach()), squares

    def _micro_batches(self, batch: Batch) -> Sequence[tuple[slice | torch.Tensor, Batch]]:
        """(the rows of ``batch`` it holds, micro-batch): contiguous slices of ``micro_batch_sequences``
        rows, or, with ``micro_batch_max_tokens``, rows of similar length within that budget (on FSDP ranks as many
        micro-batches as the rank that needs the most: each forward and backward is a collective).
        Every loss has the whole mini-batch's denominator (``minirl.objective``), so the summed
        gradient does not depend on how the rows are grouped."""
        # (shared prompts: a token budget takes a prompt's rows together and counts the prompt once, under R3 as the
        # forward will share it)
        packed, budget = self._packed, self.micro_batch_max_tokens
        prompts = packed.prompts(batch.input_ids, batch.mask, batch.routes) if packed is not None and budget is not None else None
        return micro_batches(batch, self.micro_batch_sequences, budget, padded=packed is None,
                             agree_device=self.device if self.collective else None, prompts=prompts)

    @property
    def padding_free(self) -> bool:
        """Forwards on the real tokens only (``optim.padding_free``, or ``optim.shared_prompt``, which packs too)."""
        return self._packed is not None

    @property
    def shared_prompt(self) -> bool:
        """Each prompt of a micro-batch computed once (``optim.shared_prompt``)."""
        return self._packed is not None and self._packed.shared_prompt

    # ------------------------------------------------------------------ the update

    def update(
        self, minibatch: Batch, objective: Objective, *, replay_routes: bool = False, natural_drift: bool = False,
        score: bool = False, record_routes: bool = False, old_pass: bool = False,
    ) -> UpdateResult:
        """One optimizer step on ``minibatch`` (gradient accumulation over micro-batches).

        ``natural_drift`` (with ``replay_routes``): also return ``natural_diff_frac``, the
        fraction of fed (token, layer) pairs whose replayed top-k set differs from the one the
        router would have picked itself in this forward (-1 rows not counted).
        ``score``: also return (``UpdateResult.scores``) what ``score`` would return for ``minibatch``
        at the weights before this step (``record_routes`` as there), taken from this update's own
        forward. Not on a skipped step.
        ``old_pass``: this update is also the step's old-log-prob pass (one update per global step,
        N = 1: theta_old *is* theta). The objective sees ``logp_old = logp.detach()`` (``OnPolicy``)
        and ``scores`` is always returned: from this forward, or, when the update is skipped, from
        a ``score`` pass over the unchanged weights (replaying the batch's routes if it has any).
        """
        # Over 60 lines: one optimizer step in the order it happens (inputs, backward, fp16 unscale, clip, the overflow
        # and fault skips, the guarded step); split, the skips would scatter from the checks that decide them
        if old_pass:
            objective, score = OnPolicy(objective), True
        inputs = {"logp_old": minibatch.logp_old, "logp_rollout": minibatch.logp_rollout, "logp_ref": minibatch.logp_ref}
        bad_inputs = nan_report(minibatch.advantages, minibatch.mask, inputs)  # host tensors: no GPU wait
        if bad_inputs is not None and not self.collective:
            return self._skip(f"non-finite inputs ({bad_inputs})", minibatch, old_pass, replay_routes, record_routes)
        if bad_inputs is not None:  # keep the collectives: a NaN loss makes every rank's global norm NaN, all skip
            objective = NaNLoss()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scores = _Scores(minibatch, entropy=True, device=self.device) if score else None
        try:
            measured, loss_total = self._accumulate(minibatch, objective, replay_routes, natural_drift=natural_drift,
                                                    scores=scores, record_routes=record_routes)
            logp = measured.logp
            totals = measured.metrics(objective, minibatch)
        except FloatingPointError as exc:  # a NaN log-prob at a trained token (the objective's check)
            return self._skip(f"non-finite log-probs ({exc})", minibatch, old_pass, replay_routes, record_routes)
        self.loss_scale.unscale(self.model.parameters())  # fp16: the gradients of the loss itself, before clipping
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip_norm)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor, global already
        values = to_floats({"loss": loss_total, "grad_norm": norm, **_as_tensors(totals, loss_total)})  # the one sync
        loss_sum, grad_norm = values.pop("loss"), values.pop("grad_norm")
        drift = values.pop("routing_natural_diff_frac", None)
        scale = self.loss_scale.scale
        if bad_inputs is None and math.isfinite(loss_sum) and self.loss_scale.overflowed(grad_norm):
            return self._overflow(scale, minibatch, old_pass, replay_routes, record_routes)
        if not math.isfinite(loss_sum) or not math.isfinite(grad_norm):
            bad_logp = None if bad_inputs else nan_report(None, minibatch.mask, {"logp": logp})  # rare path: may sync
            reason = (f"non-finite inputs ({bad_inputs})" if bad_inputs is not None else f"non-finite log-probs ({bad_logp})"
                      if bad_logp is not None else f"non-finite loss ({loss_sum}) or gradient norm ({grad_norm})")
            return self._skip(reason, minibatch, old_pass, replay_routes, record_routes)
        lr = self.optimizer.param_groups[0]["lr"]
        self._guard.snapshot()  # a step that poisons the weights is undone (``minirl.update_guard``)
        self.optimizer.step()
        poisoned = self._guard.check()
        if poisoned is not None:
            if not self._guard.can_undo:  # optim.update_guard=check: no copy to undo it with
                raise PoisonedWeights(f"{poisoned}; optim.update_guard=check keeps no copy to undo it")
            self._guard.restore()
            return self._skip(poisoned, minibatch, old_pass, replay_routes, record_routes)
        self.scheduler.step()
        self.updates_done += 1
        self.consecutive_faults = 0
        return UpdateResult(loss=loss_sum, grad_norm=grad_norm, lr=lr, metrics=values, natural_diff_frac=drift,
                            scores=None if scores is None else scores.result(),
                            metric_inputs=measured.cpu() if self.share_metric_inputs else None,
                            loss_scale=self.loss_scale.scale if self.loss_scale.enabled else None)

    def _overflow(self, scale: float, minibatch: Batch, old_pass: bool, replay_routes: bool, record_routes: bool) -> UpdateResult:
        """fp16: the gradient at loss scale ``scale`` overflowed (the scale is halved already): skipped as ``_skip``
        does, but not a numerical fault (every FSDP rank read the same global norm: all skip together)."""
        self.optimizer.zero_grad(set_to_none=True)
        reason = f"fp16 gradient overflow at loss scale {scale:g} (now {self.loss_scale.scale:g})"
        scores = self.score(minibatch, replay_routes=replay_routes, record_routes=record_routes) if old_pass else None
        return UpdateResult(fault=reason, scores=scores, loss_scale=self.loss_scale.scale, overflowed=True)

    def _skip(self, reason: str, minibatch: Batch, old_pass: bool, replay_routes: bool, record_routes: bool) -> UpdateResult:
        """A numerical fault: no optimizer or schedule step, gradients zeroed, the fault counted.
        As the old-log-prob pass, the unchanged weights are scored instead."""
        self.optimizer.zero_grad(set_to_none=True)
        self.faults += 1
        self.consecutive_faults += 1
        scores = self.score(minibatch, replay_routes=replay_routes, record_routes=record_routes) if old_pass else None
        return UpdateResult(fault=reason, scores=scores)

    # ------------------------------------------------------------------ checkpoint state

    def checkpoint_state(self, optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
        """Optimizer, schedule and counters (tensors and plain types: ``torch.load(weights_only=True)``). ``optimizer``:
        the optimizer's state to keep instead of ``self.optimizer.state_dict()`` (an FSDP rank's, gathered full)."""
        return {
            "optimizer": self.optimizer.state_dict() if optimizer is None else optimizer,
            "scheduler": self.scheduler.state_dict(),
            "updates_done": self.updates_done,
            "faults": self.faults,
            "consecutive_faults": self.consecutive_faults,
            "loss_scale": self.loss_scale.state_dict(),
        }

    def load_checkpoint_state(self, state: dict[str, Any], load_optimizer: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``checkpoint_state``'s values back; ``load_optimizer``: how the optimizer's state goes in instead of
        ``self.optimizer.load_state_dict`` (an FSDP rank scatters the full state into its shards)."""
        (load_optimizer or self.optimizer.load_state_dict)(state["optimizer"])
        keep_adamw_impl(self.optimizer, self.adamw_impl)  # not the saved groups' foreach / fused flags
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates_done = int(state["updates_done"])
        self.faults = int(state.get("faults", 0))
        self.consecutive_faults = int(state.get("consecutive_faults", 0))
        self.loss_scale.load_state_dict(state.get("loss_scale"))

    def _accumulate(
        self, minibatch: Batch, objective: Objective, replay_routes: bool, *, natural_drift: bool = False,
        scores: _Scores | None = None, record_routes: bool = False,
    ) -> tuple[MetricInputs, torch.Tensor]:
        """Backward ``objective`` over the micro-batches of ``minibatch`` into ``.grad`` (summed).

        Returns what the metrics are computed from (``MetricInputs``: the detached float32 log-probs
        [B, T-1] of the mini-batch's rows in their own order, 0 at padding, ...) and the summed loss (a
        float64 0-dim tensor, summed in micro-batch order: no host sync); fills ``scores`` (detached
        log-probs, entropies and, with ``record_routes``, routes) if given. The metrics, the objective's
        over the whole mini-batch from those log-probs, do not depend on how the rows were grouped into
        micro-batches (a micro-batch sum would round differently).
        """
        loss_sum = torch.zeros((), dtype=torch.float64)
        # the scores' buffer when there is one (``scores.add`` writes the same detached log-probs); on the
        # device, like everything the loop writes, so no micro-batch waits for a copy to the host
        logp_all = scores.logp if scores is not None else torch.zeros(minibatch.mask.shape, dtype=torch.float32, device=self.device)
        # an objective with an entropy term (``EntropyBonus``) is given the differentiable entropy of each forward;
        # its detached values fill the scores' entropy too (no second full-vocabulary pass for pi_old's metrics)
        entropy_all = None
        if getattr(objective, "wants_entropy", False):
            entropy_all = scores.entropy if scores is not None and scores.entropy is not None else torch.zeros_like(logp_all)
        drift = natural_drift and replay_routes
        natural: list | None = [] if drift or (scores is not None and record_routes) else None
        differing = counted = torch.zeros((), dtype=torch.long, device=self.device)
        for rows, host_micro in self._micro_batches(minibatch):
            micro = host_micro.to(self.device)
            rows = rows if isinstance(rows, slice) else to_device(rows, self.device)
            with ExitStack() as block:  # the routing block stays open through backward (recomputation)
                # the replay checks the routes it is given: the host's copy, as in ``score`` (no device wait); the
                # padding-free packing is read off the host's mask too
                fed = dataclasses.replace(micro, routes=host_micro.routes, attention_mask=host_micro.attention_mask)
                router: list | None = [] if getattr(objective, "wants_router_logits", False) else None
                out = self._logits(fed, replay_routes=replay_routes, natural=natural, block=block, router_logits=router)
                wanted = "detached" if scores is not None and scores.entropy is not None else None
                logp, entropy, _ = self._token_terms(out, micro if self.head is None else host_micro,
                                                  "grad" if entropy_all is not None else wanted)
                loss = _micro_loss(objective, logp, entropy, micro, rows, entropy_all, router)
                self.loss_scale.scaled(loss).backward()
            routes = natural.pop() if natural is not None else None
            if drift:  # replay_routes: _logits checked micro.routes; natural is a list, so routes were captured
                assert micro.routes is not None and routes is not None and self.replay is not None
                pairs = route_diff_counts(micro.routes, routes, micro.attention_mask, self.replay.num_experts)
                differing, counted = differing + pairs[0], counted + pairs[1]
            if scores is not None:
                scores.add(rows, micro, logp, None if entropy_all is not None else entropy, routes if record_routes else None)
            else:
                logp_all[rows, : logp.shape[1]] = logp.detach().float()
            loss_sum = loss_sum.to(loss.device) + loss.detach().to(torch.float64)  # = python's float sum, no sync
        return MetricInputs(logp_all, entropy_all, (differing, counted) if drift else None), loss_sum

    def gradient(self, batch: Batch, objective: Objective, *, replay_routes: bool = False,
                 with_logp: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The flat gradient of ``objective`` over ``batch``, summed over micro-batches; no step.

        Same forward/backward path as ``update`` (train mode, micro-batches, routing replay), but
        no clipping, no optimizer step, no schedule step: the weights, the optimizer state,
        ``updates_done``, the train/eval mode and the global RNG state are as before the call,
        and every ``.grad`` is left ``None`` (zeroed). Returns a detached float32 vector, the
        concatenation of ``p.grad.flatten()`` over the trainable parameters in
        ``model.parameters()`` order (zeros for a parameter the objective does not reach).
        For diagnostics (``minirl.monitor.diagnostics``): it holds one extra copy of the parameters.
        ``with_logp``: return ``(flat, logp)``, with the detached log-probs [B, T-1] of the forward.
        ``FloatingPointError`` (naming it) when a trained token's log-prob is NaN.
        """
        was_training = self.model.training
        reshard_all(self.model)  # FSDP2: every parameter as its shard (a forward leaves the root's gathered)
        params = [p for p in self.model.parameters() if p.requires_grad]
        devices = [self.device.index or 0] if self.device.type == "cuda" else []  # offloaded shards: still the GPU's
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            with torch.random.fork_rng(devices=devices):  # dropout etc. must not move the training RNG
                logp = self._accumulate(batch, objective, replay_routes)[0].logp.cpu()
            self.loss_scale.unscale(params)  # fp16: the loss's own gradient (the scale is left as it is)
            bad_logp = nan_report(None, batch.mask, {"logp": logp})  # diagnostics: a sync here is fine
            if bad_logp is not None:
                raise FloatingPointError(bad_logp)
            # on an FSDP2 rank each parameter's local shard: the ranks' vectors, one after another, are a permutation of
            # the whole gradient (norms and cosines, all the diagnostics take, do not depend on the order)
            flat = torch.cat(
                [local_shard(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1) for p in params]
            )
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.train(was_training)
        return (flat, logp) if with_logp else flat

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model weights, for the rollout engine's ``load_weights`` (LoRA adapters merged in)."""
        return merged_state_dict(self.model)


def _micro_loss(objective: Objective, logp: torch.Tensor, entropy: torch.Tensor | None, micro: Batch, rows: Any,
                entropy_all: torch.Tensor | None, router: list | None = None) -> torch.Tensor:
    """``objective``'s loss on ``micro``'s log-probs; with ``entropy_all`` (an objective that ``wants_entropy``),
    also given pi_theta's differentiable ``entropy``, kept detached in its rows; with ``router`` (an objective that
    ``wants_router_logits``), the forward's router logits."""
    given: dict[str, Any] = {} if router is None else {"router_logits": tuple(router)}
    if entropy_all is None:
        return objective(logp, micro, **given)[0]
    assert entropy is not None  # _token_terms(..., "grad")
    entropy_all[rows, : entropy.shape[1]] = entropy.detach()
    return objective(logp, micro, entropy=entropy, **given)[0]  # type: ignore[call-arg]


class NaNLoss:
    """The objective of an update whose inputs hold a NaN on an FSDP rank: a NaN loss through ``logp``, so
    the rank still runs its backward and its collectives, and the global gradient norm skips the update."""

    def __call__(self, logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        return logp.sum() * math.nan, {}


def _as_tensors(metrics: dict[str, Any], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Metrics as 0-dim tensors on ``like``'s device (an objective may return python floats)."""
    return {k: v if torch.is_tensor(v) else torch.tensor(float(v), dtype=torch.float64, device=like.device)
            for k, v in metrics.items()}


def compute_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes: its parameters' device; for FSDP2 shards offloaded to the CPU (``optim.cpu_offload``),
    their device mesh's (each forward copies them there)."""
    param = next(model.parameters())
    mesh = getattr(param, "device_mesh", None)
    if mesh is None or mesh.device_type == param.device.type:
        return param.device
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())  # the rank set its GPU before sharding
    return torch.device(mesh.device_type)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: in-place updates reach the tensor); a plain tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def reshard_all(model: torch.nn.Module) -> None:
    """Every FSDP2 group of ``model`` back to its shards (a forward leaves the root's gathered); else nothing."""
    for module in model.modules():
        reshard = getattr(module, "reshard", None)
        if callable(reshard):
            reshard()


def full_state(model: torch.nn.Module, collective: bool) -> dict[str, torch.Tensor]:
    """``model``'s state by name; on an FSDP2 rank (``collective``) the full weights gathered from every rank's
    shards to the CPU (a collective: every rank calls it; rank 0's is the whole, the others' empty)."""
    if not collective:
        return dict(model.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))  # full: plain tensors


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor], collective: bool, strict: bool = True) -> None:
    """``full_state``'s inverse: the full weights into ``model`` (on an FSDP2 rank, into its shards)."""
    if not collective:
        model.load_state_dict(state, strict=strict)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, names: list[str],
                         collective: bool) -> dict[str, Any]:
    """``optimizer.state_dict()`` in the single-process format (state keyed by the index of its parameter in ``names``,
    the trainable parameters' names in order); on an FSDP2 rank (``collective``) gathered from every rank's shards to
    the CPU (a collective: every rank calls it; rank 0's is the whole)."""
    if not collective:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    by_name: dict[str, Any] = get_optimizer_state_dict(  # the "state" / "param_groups" dict, keyed by name
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[name]: value for name, value in by_name.get("state", {}).items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in by_name.get("param_groups", [])]}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any],
                              names: list[str], collective: bool) -> None:
    """``full_optimizer_state``'s inverse: a single-process optimizer state into ``optimizer`` (on an FSDP2 rank, into
    its shards)."""
    if not collective:
        optimizer.load_state_dict(saved)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    by_name: dict[str, Any] = {
        "state": {names[i]: value for i, value in saved["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in saved["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


class _Scores:
    """What ``Trainer.score`` returns for a batch, filled micro-batch by micro-batch (detached)."""

    def __init__(self, batch: Batch, *, entropy: bool, device: torch.device | str = "cpu",
                 sum_pi_squared: bool = False) -> None:
        self.batch = batch
        self.logp = torch.zeros(batch.mask.shape, dtype=torch.float32, device=device)  # copied to the host once, in result()
        self.entropy = torch.zeros(batch.mask.shape, dtype=torch.float32, device=device) if entropy else None
        self.squares = torch.zeros(batch.mask.shape, dtype=torch.float32, device=device) if sum_pi_squared else None
        self.routes: torch.Tensor | None = None

    @torch.no_grad()
    def add(self, rows: slice | torch.Tensor, micro: Batch, logp: torch.Tensor, entropy: torch.Tensor | None,
            routes: torch.Tensor | None, squares: torch.Tensor | None = None) -> None:
        """Rows ``rows`` of the batch from a micro-batch's ``logp``, ``entropy`` and ``squares`` (sum_w pi^2)
        [b, T-1] (``entropy`` None: not wanted, or already written by the update into ``self.entropy``); ``routes``
        [b, T, L, K] the routers' own choices (-1 written at padding)."""
        cols = micro.input_ids.shape[1]
        self.logp[rows, : cols - 1] = logp.detach()
        if self.entropy is not None and entropy is not None:
            self.entropy[rows, : cols - 1] = entropy.detach()
        if self.squares is not None and squares is not None:
            self.squares[rows, : cols - 1] = squares
        if routes is not None:
            recorded = routes.to(torch.int16)
            if self.routes is None:
                self.routes = torch.full((self.batch.size, self.batch.input_ids.shape[1], *recorded.shape[2:]), -1,
                                         dtype=torch.int16, device=recorded.device)
            recorded[~to_device(micro.attention_mask, recorded.device)] = -1
            self.routes[rows, :cols] = recorded

    def result(self) -> ScoreResult:
        mask = self.batch.mask
        entropy = None if self.entropy is None else self.entropy.cpu() * mask
        routes = None if self.routes is None else self.routes.cpu()
        squares = None if self.squares is None else self.squares.cpu() * mask
        return ScoreResult(logp=self.logp.cpu() * mask, entropy=entropy, routes=routes, sum_pi_squared=squares)
