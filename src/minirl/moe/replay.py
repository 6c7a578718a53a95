"""Routing Replay (R2/R3) for Hugging Face transformers MoE models.

Usage::

    replay = RoutingReplay(model)          # attaches the hooks once
    with replay.record() as rec:           # exactly ONE forward call of `model`
        model(input_ids)
    rec.routes                             # int16 [B, T, L, K], on the model's device
    with replay.replay(routes):            # exactly ONE forward call of `model`
        loss = f(model(input_ids))
        loss.backward()                    # inside the block if gradient checkpointing is on
    with replay.replay(routes, capture_natural=True) as rep:
        model(input_ids)
    rep.natural_routes                     # int16 [B, T, L, K]: what each router picked itself

Contract
--------
* One block covers exactly one forward call of the model passed to ``RoutingReplay``. A rollout
  engine that decodes with a KV cache opens one ``record()`` per model call: one for the prefill
  ([B, T_prompt, L, K]) and one per decode step ([B, 1, L, K]), then concatenates along T. A second
  forward call inside a block raises ``ValueError`` at once; so does a forward that does not go
  through the model (``model.model(...)``) because the batch layout is taken from that call.
* Routes are laid out [B, T, L, K]: B and T are those of the ``input_ids`` (or ``inputs_embeds``)
  of the forward call, L counts the MoE layers in model order and K is the top-k. Routers see the
  hidden states as B*T flattened rows; row b*T + t is token (b, t).
* On replay, a position whose K entries are all -1 is routed naturally; any other position must
  hold K valid expert ids and is forced to them. Only the selection is forced: gate weights are
  recomputed from the live router logits with the family's own scoring (see ``families.py``), so
  the router keeps receiving gradients. Replaying a fresh recording is bitwise identical to not
  replaying, logits and gradients alike.
* When a ``replay`` block exits normally, every MoE layer must have consumed its routes exactly
  once; otherwise ``ValueError`` names the first offending layer. A ``record`` block likewise
  requires every layer to have routed exactly once.
* ``capture_natural=True`` also keeps, per MoE layer, the top-k the router computed by itself
  before being overridden (it computes it anyway: the cost is one int16 copy per layer). Layer
  l's natural choice is taken on the hidden states the *replayed* routing of layers < l produced,
  i.e. it answers "given this input, would this router have picked the replayed experts?".
  Without it (the default) the replay path is exactly the one above: nothing is kept.
* Gradient checkpointing: routers run again during ``backward``. Inside the block the recomputation
  replays the same routes (and is not counted as a consumption); a recomputation that happens after
  a replay block has closed raises ``RuntimeError`` instead of silently routing naturally.
* Outside a block each hook checks one attribute and returns: no cost, no change of behaviour.
  ``remove()`` detaches the hooks. A ``copy.deepcopy`` of the model carries the hooks along but they
  ignore the copy; build a separate ``RoutingReplay`` for the copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Self, cast

import torch
import torch.nn as nn

from minirl.types import to_device

from .families import RouterSpec, lookup, supported_families

ROUTE_DTYPE = torch.int16


class UnsupportedModelError(TypeError):
    """The model has no MoE router that routing replay knows how to drive."""


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


@dataclass
class Recording:
    """Handle yielded by ``RoutingReplay.record()``; ``routes`` is filled when the block exits."""

    routes: torch.Tensor | None = None  # int16 [B, T, L, K]


@dataclass
class Replayed:
    """Handle yielded by ``RoutingReplay.replay()``; ``natural_routes`` is filled when the block
    exits, and only with ``capture_natural=True``."""

    natural_routes: torch.Tensor | None = None  # int16 [B, T, L, K]: each router's own top-k


@dataclass
class _Site:
    layer: int
    name: str
    module: nn.Module
    spec: RouterSpec


@dataclass
class _Block:
    mode: str  # "record" or "replay"
    shape: tuple[int, int] | None = None  # (B, T) of the forward call
    counts: list[int] = field(default_factory=list)
    recorded: list[torch.Tensor | None] = field(default_factory=list)
    routes: torch.Tensor | None = None  # long [B, T, L, K] on the router device (replay)
    all_natural: list[bool] = field(default_factory=list)  # per layer: every row is -1
    any_natural: list[bool] = field(default_factory=list)  # per layer: some row is -1
    forced: list[torch.Tensor | None] = field(default_factory=list)  # per layer, for recomputation
    capture_natural: bool = False  # replay: keep each router's own top-k in ``recorded``


class RoutingReplay:
    """Record and replay the top-k expert selection of every MoE router of ``model``."""

    def __init__(self, model: nn.Module):
        self.model = model
        sites: list[_Site] = []
        unsupported: list[str] = []
        for name, module in model.named_modules():
            found = lookup(module)
            if found is None:
                continue
            cls, spec = found
            if isinstance(spec, RouterSpec):
                sites.append(_Site(len(sites), name, module, spec))
            else:
                unsupported.append(f"{name or '<root>'} ({cls}): {spec}")
        families = ", ".join(supported_families())
        if unsupported:
            raise UnsupportedModelError(
                f"{type(model).__name__} has MoE routers routing replay cannot drive: {unsupported[0]}"
                f"{f' (and {len(unsupported) - 1} more)' if len(unsupported) > 1 else ''}. "
                f"Supported families: {families}."
            )
        if not sites:
            raise UnsupportedModelError(
                f"no supported MoE router found in {type(model).__name__} "
                f"(model_type={getattr(getattr(model, 'config', None), 'model_type', None)!r}); "
                f"dense models have nothing to replay. Supported families: {families}."
            )
        top_ks = {s.spec.top_k(s.module) for s in sites}
        num_experts = {s.spec.num_experts(s.module) for s in sites}
        if len(top_ks) != 1 or len(num_experts) != 1:
            raise UnsupportedModelError(
                f"{type(model).__name__}: MoE layers differ in top_k {sorted(top_ks)} or num_experts "
                f"{sorted(num_experts)}; routes need one [L, K] layout."
            )
        self._sites = sites
        self.num_layers: int = len(sites)
        self.top_k: int = top_ks.pop()
        self.num_experts: int = num_experts.pop()
        if self.num_experts > torch.iinfo(ROUTE_DTYPE).max:
            raise UnsupportedModelError(f"{self.num_experts} experts do not fit the int16 route format")
        config = getattr(model, "config", None)
        self.family: str = getattr(config, "model_type", None) or sites[0].spec.family
        self.layer_names: list[str] = [s.name for s in sites]

        self.replayed_rows: list[int] = [0] * self.num_layers  # see ``validate``
        self._block: _Block | None = None
        self._replayed_graph_pending = False  # a replay forward whose graph may still recompute
        # hooks are closures, not bound methods, so that a deepcopy of the model shares (and ignores)
        # them instead of deep-copying this object
        self._handles = [model.register_forward_pre_hook(self._make_model_hook(), with_kwargs=True)]
        for site in sites:
            self._handles.append(
                site.module.register_forward_hook(self._make_router_hook(site), with_kwargs=True)
            )

    # ---------------------------------------------------------------------------------------------
    # public API

    @contextmanager
    def record(self) -> Iterator[Recording]:
        """Record the routing of exactly one forward call; ``rec.routes`` is set on exit."""
        rec = Recording()
        block = self._open("record")
        try:
            yield rec
        except BaseException:
            self._block = None
            raise
        self._block = None
        rec.routes = self._collect(block)

    @contextmanager
    def replay(self, routes: torch.Tensor, *, capture_natural: bool = False,
               counted: torch.Tensor | None = None) -> Iterator[Replayed]:
        """Force the routing of exactly one forward call to ``routes`` [B, T, L, K] (-1 = natural).

        With ``capture_natural``, ``handle.natural_routes`` [B, T, L, K] (int16) holds on exit the
        top-k each router would have picked itself at every position (see the module docstring).
        ``counted``: the routes [B', T', L, K] the call replays on behalf of, counted in ``replayed_rows``
        instead of ``routes`` (``optim.shared_prompt``: a packed call whose one copy of a prompt, with
        the same routes in every row, stands for each of the prompt's rows).
        """
        long_routes, all_nat, any_nat, forced = self._validate(routes)
        if counted is not None:
            forced = self._validate(counted)[3]
        block = self._open("replay")
        block.routes = long_routes
        block.all_natural = all_nat
        block.any_natural = any_nat
        block.forced = [None] * self.num_layers
        block.capture_natural = capture_natural
        handle = Replayed()
        try:
            yield handle
        except BaseException:
            self._block = None
            raise
        self._block = None
        if block.shape is None:
            raise ValueError(
                "routing replay: MoE layer 0 consumed its routes 0 times (expected exactly once): "
                "the model was not called inside the replay() block"
            )
        for layer, count in enumerate(block.counts):
            if count != 1:
                raise ValueError(
                    f"routing replay: MoE layer {layer} ({self.layer_names[layer]}) consumed its routes "
                    f"{count} times (expected exactly once per replay() block)"
                )
        for layer, count in enumerate(forced):
            self.replayed_rows[layer] += count
        if capture_natural:
            handle.natural_routes = self._stack(block)

    def validate(self, routes: torch.Tensor) -> list[int]:
        """Check ``routes`` [B, T, L, K] against this model as ``replay()`` does (shape, layer count,
        expert range, all-or-none -1 rows; ``ValueError`` naming the MoE layer otherwise) and return
        how many rows per layer are forced (not -1).

        ``replayed_rows[l]`` counts the forced rows of layer l that closed ``replay()`` blocks have
        consumed since construction; comparing its increase with ``validate(routes)`` checks that
        every recorded route of a batch was replayed, whatever the micro-batching.
        """
        return self._validate(routes)[3]

    def remove(self) -> None:
        """Detach every hook (the object is unusable afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ---------------------------------------------------------------------------------------------
    # internals

    def _open(self, mode: str) -> _Block:
        if self._block is not None:
            raise RuntimeError(f"a {self._block.mode}() block is already open; blocks do not nest")
        if not self._handles:
            raise RuntimeError("RoutingReplay.remove() was called; create a new RoutingReplay")
        block = _Block(mode=mode, counts=[0] * self.num_layers, recorded=[None] * self.num_layers)
        self._replayed_graph_pending = mode == "replay"
        self._block = block
        return block

    def _validate(self, routes: torch.Tensor) -> tuple[torch.Tensor, list[bool], list[bool], list[int]]:
        if not isinstance(routes, torch.Tensor):
            raise ValueError(f"routes must be a torch.Tensor, got {type(routes).__name__}")
        if routes.dtype.is_floating_point or routes.dtype.is_complex or routes.dtype == torch.bool:
            raise ValueError(f"routes must be an integer tensor, got dtype {routes.dtype}")
        L, K = self.num_layers, self.top_k
        shape = f"routes must have shape [B, T, L={L}, K={K}] for this model, got {tuple(routes.shape)}"
        if routes.dim() != 4:
            raise ValueError(shape)
        if routes.shape[2] < L:
            layer = int(routes.shape[2])
            raise ValueError(
                f"{shape}: MoE layer {layer} ({self.layer_names[layer]}) has no routes (the routes cover "
                f"{layer} MoE layers, the model has {L}); were they recorded on another model?"
            )
        if routes.shape[2] > L:
            raise ValueError(
                f"{shape}: route layer {L} has no MoE layer to consume it (the model's last MoE layer is "
                f"{L - 1}, {self.layer_names[-1]}); were they recorded on another model?"
            )
        if routes.shape[3] != K:
            raise ValueError(f"{shape}: the model routes each token to top_k={K} experts, the routes hold {routes.shape[3]}")
        if routes.numel():
            lo, hi = int(routes.min()), int(routes.max())
            if lo < -1 or hi >= self.num_experts:
                bad = ((routes < -1) | (routes >= self.num_experts)).nonzero()[0]
                b, t, layer = (int(v) for v in bad[:3])
                raise ValueError(
                    f"route indices must lie in [-1, {self.num_experts}) (num_experts={self.num_experts}), "
                    f"got values in [{lo}, {hi}]; first bad row (b={b}, t={t}) of MoE layer {layer} "
                    f"({self.layer_names[layer]}): {routes[b, t, layer].tolist()}"
                )
        neg = routes == -1
        natural = neg.all(dim=-1)  # [B, T, L]
        partial = neg.any(dim=-1) & ~natural
        if bool(partial.any()):
            b, t, layer = (int(v) for v in partial.nonzero()[0])
            raise ValueError(
                f"routes row (b={b}, t={t}, layer={layer}) mixes -1 with expert ids "
                f"{routes[b, t, layer].tolist()}: a row must be all -1 (natural routing) or all valid"
            )
        flat = natural.reshape(-1, L)
        rows = flat.shape[0]
        forced = (rows - flat.sum(dim=0)).tolist() if rows else [0] * L  # forced rows per layer
        all_nat = [n == 0 for n in forced]
        any_nat = [n < rows for n in forced] if rows else [True] * L
        device = self._device()
        return to_device(routes.long(), device), all_nat, any_nat, forced  # checked on the host, then sent

    def _device(self) -> torch.device:
        for site in self._sites:
            for tensor in site.module.parameters():
                return tensor.device
        return torch.device("cpu")

    def _collect(self, block: _Block) -> torch.Tensor:
        if block.shape is None:
            raise ValueError(
                "routing record: MoE layer 0 routed 0 times (expected exactly once): "
                "the model was not called inside the record() block"
            )
        for layer, count in enumerate(block.counts):
            if count != 1:
                raise ValueError(
                    f"routing record: MoE layer {layer} ({self.layer_names[layer]}) routed {count} times "
                    f"(expected exactly once per record() block)"
                )
        return self._stack(block)

    def _stack(self, block: _Block) -> torch.Tensor:
        assert block.shape is not None  # the callers raise a clear error first
        B, T = block.shape
        recorded = cast(list[torch.Tensor], block.recorded)  # every layer routed exactly once (callers check)
        stacked = torch.stack(recorded, dim=1)  # [N, L, K]
        return stacked.reshape(B, T, self.num_layers, self.top_k)

    def _make_model_hook(self):
        def hook(module, args, kwargs):
            if module is not self.model:  # a deepcopy of the model carries this hook: ignore it
                return None
            return self._on_model_forward(args, kwargs)

        return hook

    def _on_model_forward(self, args, kwargs):
        block = self._block
        if block is None:
            if not _in_backward():
                self._replayed_graph_pending = False
            return None
        if _in_backward():
            return None
        if block.shape is not None:
            raise ValueError(
                f"a {block.mode}() block covers exactly one forward call of the model; "
                f"open one block per call (e.g. one per prefill / decode step)"
            )
        x = kwargs.get("input_ids")
        if x is None:
            x = kwargs.get("inputs_embeds")
        if x is None and args and isinstance(args[0], torch.Tensor):
            x = args[0]
        if x is None or x.dim() < 2:
            raise ValueError(
                "routing replay needs the batch layout: call the model with input_ids [B, T] "
                "(or inputs_embeds [B, T, H])"
            )
        B, T = int(x.shape[0]), int(x.shape[1])
        if block.mode == "replay":
            assert block.routes is not None  # replay() opens its block with the routes
            rb, rt = block.routes.shape[:2]
            if (rb, rt) != (B, T):
                raise ValueError(
                    f"routes have batch/seq shape [B={rb}, T={rt}] but the forward call has [B={B}, T={T}]"
                )
        block.shape = (B, T)
        return None

    def _make_router_hook(self, site: _Site):
        layer = site.layer
        spec = site.spec

        def hook(module, args, kwargs, output):
            if module is not site.module:  # a deepcopy of the model carries this hook: ignore it
                return None
            block = self._block
            if block is None:
                if self._replayed_graph_pending and _in_backward():
                    raise RuntimeError(
                        f"MoE layer {layer} is being recomputed during backward (gradient checkpointing) "
                        "after its replay() block closed; call backward() inside the replay() block"
                    )
                return None
            return self._on_router(block, site, layer, spec, args, kwargs, output)

        return hook

    def _on_router(self, block: _Block, site: _Site, layer: int, spec: RouterSpec, args, kwargs, output):
        recompute = _in_backward()
        if block.shape is None and not recompute:
            raise ValueError(
                f"MoE layer {layer} ran inside a {block.mode}() block but the forward did not go through "
                f"the model given to RoutingReplay ({type(self.model).__name__}); call that model"
            )
        natural_idx = spec.natural_indices(site.module, output)
        if block.mode == "record":
            if recompute:
                return None
            if block.counts[layer]:
                raise ValueError(
                    f"routing record: MoE layer {layer} routed twice in one record() block; "
                    "a record() block covers exactly one forward call"
                )
            self._check_rows(block, layer, natural_idx)
            block.counts[layer] += 1
            block.recorded[layer] = natural_idx.detach().to(ROUTE_DTYPE)
            return None

        # replay
        if recompute:
            forced = block.forced[layer]
            if forced is None:
                return None
        else:
            block.counts[layer] += 1
            if block.counts[layer] > 1:
                raise ValueError(
                    f"routing replay: MoE layer {layer} ({self.layer_names[layer]}) asked for its routes "
                    "twice in one replay() block (expected exactly once)"
                )
            self._check_rows(block, layer, natural_idx)
            if block.capture_natural:
                block.recorded[layer] = natural_idx.detach().to(ROUTE_DTYPE)
            if block.all_natural[layer]:
                return None
            assert block.routes is not None  # replay() opens its block with the routes
            forced = block.routes[:, :, layer, :].reshape(-1, self.top_k)
            if forced.device != natural_idx.device:
                forced = forced.to(natural_idx.device)
            if block.any_natural[layer]:
                keep = (forced == -1).all(dim=-1, keepdim=True)
                forced = torch.where(keep, natural_idx, forced)
            block.forced[layer] = forced
        hidden = args[0] if args else kwargs["hidden_states"]
        natural_w = output[spec.weights_pos]
        weights = spec.score(site.module, hidden, output, forced)
        if weights.shape != natural_w.shape or weights.dtype != natural_w.dtype:
            raise RuntimeError(
                f"routing replay ({spec.family}, gate weights = {spec.scoring}): recomputed gate weights {tuple(weights.shape)} {weights.dtype} "
                f"do not match the router's {tuple(natural_w.shape)} {natural_w.dtype}; the router code "
                "changed, update minirl.moe.families"
            )
        new = list(output)
        new[spec.weights_pos] = weights
        if spec.index_pos is not None:
            new[spec.index_pos] = forced
        return type(output)(new) if isinstance(output, tuple) else new

    def _check_rows(self, block: _Block, layer: int, natural_idx: torch.Tensor) -> None:
        assert block.shape is not None  # set by the model's pre-hook before any router runs
        B, T = block.shape
        if natural_idx.dim() != 2 or natural_idx.shape[0] != B * T or natural_idx.shape[1] != self.top_k:
            raise ValueError(
                f"MoE layer {layer} routed {tuple(natural_idx.shape)} rows but the forward call has "
                f"B*T = {B}*{T} = {B * T} tokens with top_k={self.top_k}"
            )


def route_bytes_per_1k_tokens(num_layers: int, top_k: int, dtype: torch.dtype = torch.int16) -> int:
    """Bytes needed to store the routes of 1,000 tokens: 1000 * L * K * itemsize(dtype)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 1000 * int(num_layers) * int(top_k) * itemsize


# ------------------------------------------------------------------------------------------------
# the route plan of one global step


class RoutePlan:
    """Where one global step's routes come from, which passes consume them, and the check that each
    recorded route is consumed exactly once per pass (``RuntimeError`` naming the MoE layer).

    ========  =======================================  ===================  ====================
    mode      routes                                   pi_old pass          every update
    ========  =======================================  ===================  ====================
    none      none replayed                            natural              natural
    R2        the trainer's, recorded at theta_old     records them         replays them
    R3        the engine's, recorded while sampling    replays them         replays them
    ========  =======================================  ===================  ====================

    With ``metrics`` (``moe.routing_metrics``) the engine records its routes whatever the mode and
    the pi_old pass records the trainer's, for ``routing/*``. ``replay`` is a ``RoutingReplay`` (or
    a ``TrainerGroup``'s ``GroupReplay``, whose ``replayed_rows`` sum the ranks' counters); None for
    a dense model (mode ``none``). A new plan is made for every global step::

        plan = RoutePlan(replay, mode, metrics=True)
        batch = plan.start(collate(engine.generate(..., record_routes=plan.engine_records)))
        with plan.old_pass() as routing:
            old = trainer.score(batch, **routing.kwargs)
        batch = plan.scored(batch.with_logp_old(old.logp), old)   # R2: the recorded routes
        with plan.updates() as routing:
            for minibatch in split(batch, n):
                trainer.update(minibatch, objective, **routing.kwargs)
    """

    def __init__(self, replay: Any, mode: str, *, metrics: bool) -> None:
        if mode != "none" and replay is None:
            raise ValueError(f"routing replay {mode} needs an MoE model with a RoutingReplay")
        self.replay, self.mode = replay, mode
        self.metrics = metrics and replay is not None
        self.engine_routes: torch.Tensor | None = None  # as sampled (for routing/* whatever the mode)
        self._expected: list[int] | None = None  # forced rows per layer of the routes the batch carries

    @property
    def engine_records(self) -> bool:
        """Whether the engine must record its routes while sampling."""
        return self.mode == "R3" or self.metrics

    @property
    def old_pass_optional(self) -> bool:
        """Whether the pi_old pass may be fused into a single update's forward (not under R2: it
        records the routes there, before any update)."""
        return self.mode != "R2"

    def start(self, batch: Any) -> Any:
        """The collated batch (with the engine's routes if it recorded them) -> the batch the trainer
        sees: the engine's routes kept under R3 only. Validates them against the model."""
        self.engine_routes = batch.routes
        if batch.routes is not None and self.replay is not None:
            self._expected = self.replay.validate(batch.routes)  # ValueError naming the MoE layer
        return batch if self.mode == "R3" else batch.with_routes(None)

    def old_pass(self) -> _Pass:
        """The pi_old pass (``Trainer.score``): replays under R3, records under R2 (and for metrics)."""
        kwargs = {"replay_routes": self.mode == "R3", "record_routes": self.mode == "R2" or self.metrics}
        return _Pass(self, "old-log-prob pass", kwargs, check=self.mode == "R3")

    def lag_pass(self) -> _Pass:
        """``rollout.async_split_mismatch``'s pass at the engine's weights (``EngineWeights.logprobs``): replays
        under R3, as the pi_old pass does, and records nothing."""
        return _Pass(self, "engine-weights pass", {"replay_routes": self.mode == "R3"}, check=self.mode == "R3")

    def scored(self, batch: Any, old: Any) -> Any:
        """After the pi_old pass (``old``, a ``ScoreResult``): under R2 the batch carries the routes it
        recorded, which every update must then replay."""
        if self.mode != "R2":
            return batch
        self._expected = self.replay.validate(old.routes)
        return batch.with_routes(old.routes)

    def updates(self, *, old_pass: bool = False) -> _Pass:
        """The N gradient updates (``Trainer.update``): replay under R2 and R3; R2 also measures its
        routes' drift. ``old_pass``: the single update is also the pi_old pass (``Trainer.update``)."""
        kwargs = {"replay_routes": self.mode != "none", "natural_drift": self.mode == "R2" and self.metrics,
                  "record_routes": self.metrics, "old_pass": old_pass}
        return _Pass(self, "updates", kwargs, check=self.mode != "none")

    def _counts(self) -> list[int]:
        return [] if self.replay is None else list(self.replay.replayed_rows)  # one read (a group sums ranks)

    def _check(self, start: list[int], phase: str) -> None:
        replayed = self._counts()
        for layer, (first, want) in enumerate(zip(start, self._expected or [])):
            got = replayed[layer] - first
            if got != want:
                raise RuntimeError(
                    f"routing replay ({phase}): MoE layer {layer} ({self.replay.layer_names[layer]}) replayed {got} "
                    f"of the {want} recorded (token, layer) routes of the global batch; each must be consumed exactly once"
                )


class _Pass:
    """A context over one pass of a ``RoutePlan``: ``kwargs`` for the trainer call; on a normal exit,
    every route of the batch was replayed exactly once, unless ``waive`` was called."""

    def __init__(self, plan: RoutePlan, phase: str, kwargs: dict[str, bool], *, check: bool) -> None:
        self.plan, self.phase, self.kwargs, self.check = plan, phase, kwargs, check
        self._start: list[int] = []

    def __enter__(self) -> Self:
        self._start = self.plan._counts()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None and self.check:
            self.plan._check(self._start, self.phase)

    def waive(self, reason: bool) -> None:
        """No check if ``reason`` (a skipped update may stop before consuming its routes)."""
        self.check = self.check and not reason

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Replayed forwards inside (the diagnostics') are not this pass's consumption."""
        before = self.plan._counts()
        try:
            yield
        finally:
            after = self.plan._counts()
            self._start = [s + a - b for s, b, a in zip(self._start, before, after)]
