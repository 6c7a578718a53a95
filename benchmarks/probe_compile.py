"""Would ``torch.compile`` speed up the trainer's forward + backward? Eager vs compiled, interleaved.

Builds the demo config's model (``qwen3-moe-2m``, no cold start), compiles it, and times one forward +
backward of the summed token log-probs on 64-row batches of three widths (the update's work for one
micro-batch; widths vary as response lengths do), eager and compiled alternating. Prints the compile time
(the first three compiled steps), the median of each and the largest log-prob and gradient gaps.

    python benchmarks/probe_compile.py [--rounds 6] [--threads 1] [--widths 40 44 37 --timed-widths 44 38 41]
        [--regions whole | layers | attention,norms,experts] [--replay]

The trace arms' responses (~210-240 tokens): ``--widths 230 241 212 --timed-widths 226 209 218``.

``--regions``: ``whole`` compiles the model (``torch.compile(model, dynamic=True)``; with ``--replay``
dynamo traces the replay hooks); ``layers`` each decoder
layer in place, with the routers' replay hooks kept out of the graph (``torch._dynamo.disable``);
``attention``, ``norms``, ``experts`` (comma-separated) those sub-modules of every layer in place, the
routers eager. ``--replay``: every timed step replays routes recorded by the eager model (R3 as the
trainer runs it), on both sides.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from minirl.algo import token_logprobs
from minirl.config import load_config
from minirl.moe import RoutingReplay
from minirl.runtime import build_model

SUBMODULES = {"attention": "Attention", "norms": "RMSNorm", "experts": "Experts"}  # class-name suffixes


def compile_regions(model: torch.nn.Module, regions: str) -> torch.nn.Module:
    """A compiled copy of ``model`` (see ``--regions``); the copy's replay hooks are attached by the caller."""
    compiled = copy.deepcopy(model)
    if regions == "whole":
        return torch.compile(compiled, dynamic=True)
    layers = compiled.get_decoder().layers
    if regions == "layers":
        for layer in layers:
            layer.compile(dynamic=True)
        return compiled
    suffixes = tuple(SUBMODULES[name] for name in regions.split(","))
    for layer in layers:
        for module in layer.modules():
            if type(module).__name__.endswith(suffixes):
                module.compile(dynamic=True)
    return compiled


def keep_hooks_eager(model: torch.nn.Module) -> None:
    """Wrap every forward hook below ``model`` in ``torch._dynamo.disable``: a compiled layer runs the
    routers' replay hooks eagerly (a graph break) instead of tracing their Python state."""
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            module._forward_hooks[key] = torch._dynamo.disable(hook)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--config", default="configs/demo.yaml")
    parser.add_argument("--widths", type=int, nargs="+", default=[40, 44, 37], help="compile-time widths")
    parser.add_argument("--timed-widths", type=int, nargs="+", default=[44, 38, 41])
    parser.add_argument("--regions", default="whole", help="whole | layers | attention,norms,experts (see above)")
    parser.add_argument("--replay", action="store_true", help="replay eager-recorded routes on both sides (R3)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, ["cold_start.enabled=false"])
    built = build_model(cfg)
    model = built[0] if isinstance(built, tuple) else built
    model.train()
    compiled = compile_regions(model, args.regions)
    replays = {}
    if args.replay:
        replays = {"eager": RoutingReplay(model), "compiled": RoutingReplay(getattr(compiled, "_orig_mod", compiled))}
        if args.regions != "whole":
            keep_hooks_eager(compiled)
    generator = torch.Generator().manual_seed(0)

    def batch(width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids = torch.randint(3, 60, (64, width), generator=generator)
        if not replays:
            return ids, None
        with torch.no_grad(), replays["eager"].record() as recording:
            model(input_ids=ids, use_cache=False)
        return ids, recording.routes

    def step(name: str, ids: torch.Tensor, routes: torch.Tensor | None) -> torch.Tensor:
        module = model if name == "eager" else compiled
        module.zero_grad(set_to_none=True)
        with replays[name].replay(routes.long()) if routes is not None else torch.enable_grad():
            logp = token_logprobs(module(input_ids=ids, use_cache=False).logits[:, :-1].float(), ids[:, 1:])
            logp.sum().backward()
        return logp.detach()

    started = time.perf_counter()
    for width in args.widths:
        step("compiled", *batch(width))
    print(f"compile + first {len(args.widths)} compiled steps: {time.perf_counter() - started:.1f} s "
          f"(regions: {args.regions}{', R3 replay' if replays else ''})")
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    logp_gap = grad_gap = 0.0
    for _ in range(args.rounds):
        for width in args.timed_widths:
            ids, routes = batch(width)
            logps = {}
            for name in ("eager", "compiled"):
                started = time.perf_counter()
                logps[name] = step(name, ids, routes)
                times[name].append(time.perf_counter() - started)
            logp_gap = max(logp_gap, (logps["eager"] - logps["compiled"]).abs().max().item())
            grad_gap = max(grad_gap, max((p.grad - q.grad).abs().max().item() for p, q in
                                         zip(model.parameters(), compiled.parameters()) if p.grad is not None))
    eager, fast = (statistics.median(times[k]) * 1000 for k in ("eager", "compiled"))
    widths = f"{min(args.timed_widths)}-{max(args.timed_widths)}"
    print(f"max |eager - compiled|: log-prob {logp_gap:.2e}, gradient {grad_gap:.2e}")
    print(f"forward + backward, 64 rows x {widths} tokens, median: eager {eager:.1f} ms, compiled {fast:.1f} ms "
          f"({eager / fast:.2f}x)")


if __name__ == "__main__":
    main()
