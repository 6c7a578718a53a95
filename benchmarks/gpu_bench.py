"""Issue 20's GPU figures from one run, side by side: engine vs HF generate, R3 overhead, trainer MFU, RL step, trace arm.

    python benchmarks/gpu_bench.py [--out DIR]     # one H200: the ~0.9 B Qwen3-MoE, < 8 min in all
    python benchmarks/gpu_bench.py --tiny          # the same code path on CPU with a tiny model (~1 min)

Each part runs in its own child process under its own timeout (``--part NAME`` runs one), so one hang
or out-of-memory does not take the others; every part writes its figures to ``OUT/gpu_bench.json``
(``--out``, default ``$OUT`` or ``.``) and the parent prints them side by side at the end:

* ``engine``  NativeEngine (bf16) with CUDA graphs off (the dynamic loop) and on (``rollout.cuda_graphs``:
  bucketed static-cache decode, one graph per bucket) vs HF ``generate`` (bf16, same weights,
  ``top_k=0``) in tokens/s at 64 x 256 and 256 x 128 (rows x new tokens, every row forced to the full
  length), median of alternating runs; graphs on with and without R3 route recording (its
  overhead); and ``agreement``: graphs on vs off on the same prompts with one stream per row, the
  same routes and log-probs within bf16 tolerance (0.05) until a row's samples part (``ok``).
* ``trainer`` one bf16 update (``optim.precision=bf16``) of micro-batches of >= 16k tokens: tokens/s
  and model FLOPs utilisation = 6 x active parameters x tokens / time / ``--peak-tflops`` (790, the
  measured bf16 matmul peak of an H200); and ``padding_free``: the padded update against
  ``optim.padding_free`` on the same rows cut to ~5/8 real tokens, alternating, their log-probs' gap and the
  padding-free update's host syncs; ``shared_prompt``: ``optim.padding_free`` against ``optim.shared_prompt`` on groups
  of 8 rows with a half-width prompt each and completions of an eighth to a half of the width, alternating, with the
  log-probs' gap and the shared update's host syncs; and ``chunked_head``: the whole logits against ``optim.logprob_chunk_tokens``
  (4096) on the same update, alternating, with each one's peak device memory.
* ``lean``    fp32 forward + backward of one micro-batch, transformers vs ``benchmarks/lean_forward.py`` (no module
  stack, no mask plumbing), with each one's host syncs.
* ``rl_step`` one MiniRL global step (R3, N = 2, bf16 trainer and engine) of the same model through ``minirl.loop``,
  and a census of the host synchronisations of one more step by source line (CUDA's sync debug mode).
* ``trace``   ``minirl train experiments/stress/trace/n8_minirl_r3.yaml cluster.device=cuda``: wall time.
  Both with ``rollout.cuda_graphs`` on (``--cuda-graphs off``: the dynamic decode loop).
* ``offload`` (only when named: ``--parts offload``, or appended to the list) the ``rl_step`` step again with
  ``optim.cpu_offload`` (FSDP2's ``CPUOffloadPolicy`` on one trainer rank): its seconds, the rank's peak device memory
  and where its parameters live, beside ``rl_step``'s in-process peak (the engine's and the trainer's together).

The model is built from a config (no download): hidden 1024, 16 layers, 32 experts top-4, expert width
512, 16/4 heads, head_dim 64, vocab 32,000 (``--tiny``: hidden 64, 2 layers, 8 experts, vocab 256).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("engine", "trainer", "lean", "rl_step", "trace")  # the default run, < 8 min on an H200
OPTIONAL_PARTS = ("offload",)
TIMEOUT_S = {"engine": 240, "trainer": 120, "lean": 60, "rl_step": 120, "trace": 180,  # expected on an H200: ~140, 60, 20?, 60, 130
             "offload": 240}


def model_config(tiny: bool) -> Any:
    from transformers import Qwen3MoeConfig

    size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, vocab_size=256) if tiny else \
        dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
             num_experts=32, num_experts_per_tok=4, moe_intermediate_size=512, vocab_size=32000)  # fmt: skip
    return Qwen3MoeConfig(**size, intermediate_size=4 * size["hidden_size"], max_position_embeddings=2048,
                          norm_topk_prob=True, pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=False)


def build(tiny: bool, device: str) -> Any:
    import torch
    from transformers import Qwen3MoeForCausalLM

    from minirl.models.presets import EXPERTS_IMPLEMENTATION

    cfg = model_config(tiny)
    cfg._experts_implementation = EXPERTS_IMPLEMENTATION
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(cfg).float().to(device)


def active_parameters(config: Any) -> int:
    """Parameters one token passes through: all but the unrouted experts (embeddings excluded)."""
    h, layers, k, width = config.hidden_size, config.num_hidden_layers, config.num_experts_per_tok, config.moe_intermediate_size
    heads, kv, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attention = h * dim * (heads + 2 * kv) + heads * dim * h
    experts = k * 3 * h * width + h * config.num_experts
    return layers * (attention + experts) + h * config.vocab_size  # + lm_head


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def part_engine(tiny: bool, device: str) -> dict[str, Any]:
    import torch

    from minirl.rollout.native import NativeEngine
    from minirl.types import SamplingParams

    model = build(tiny, device)
    vocab = model.config.vocab_size
    # graphs on: CUDA graphs per bucket; on a CPU (--tiny) the same bucketed code, eager
    graphs_on = {"cuda_graphs": True} if device == "cuda" else {"decode_path": "static"}
    common = dict(eos_token_id=vocab, pad_token_id=0, precision="bf16", device=device)  # EOS never drawn: full length
    engines = {"graphs_off": NativeEngine(model, **common), "graphs_on": NativeEngine(model, **common, **graphs_on)}
    hf = build(tiny, device).to(torch.bfloat16).eval()
    shapes = [(4, 8), (8, 4)] if tiny else [(64, 256), (256, 128)]
    repeats = 1 if tiny else 2
    out: dict[str, Any] = {"graphs_on": graphs_on, "agreement": agreement(model, common, graphs_on, tiny)}
    for rows, new in shapes:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(2, vocab, (16,), generator=g).tolist() for _ in range(rows)]

        def run_engine(name: str, record: bool, seed: int, prompts: list = prompts, rows: int = rows, new: int = new) -> float:
            sync(device)
            start = time.perf_counter()
            done = engines[name].generate_ids(prompts, 1, SamplingParams(max_new_tokens=new, seed=seed), record_routes=record)
            sync(device)
            assert all(len(c.completion_ids) == new for c in done)
            return rows * new / (time.perf_counter() - start)

        def run_hf(seed: int, prompts: list = prompts, rows: int = rows, new: int = new) -> float:
            torch.manual_seed(seed)
            ids = torch.tensor(prompts, device=device)
            sync(device)
            start = time.perf_counter()
            with torch.inference_mode():
                hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                            top_p=1.0, max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None)
            sync(device)
            return rows * new / (time.perf_counter() - start)

        for name in engines:
            run_engine(name, False, 99)  # warm-up
        run_hf(99)
        runs: dict[str, list[float]] = {}
        arms = [("graphs_off", False), ("graphs_on", False), ("graphs_on", True)]  # R3 overhead: graphs on
        for seed in range(repeats):  # alternating
            for name, record in arms:
                runs.setdefault(f"{name}{'_r3' if record else ''}", []).append(run_engine(name, record, seed))
            runs.setdefault("hf", []).append(run_hf(seed))
        median = {key: statistics.median(values) for key, values in runs.items()}
        row = {f"{key}_tok_s": value for key, value in median.items()}
        for name in engines:
            row[f"{name}_over_hf"] = median[name] / median["hf"]
        row["r3_overhead_frac"] = median["graphs_on"] / median["graphs_on_r3"] - 1
        out[f"{rows}x{new}"] = row
    return out


def agreement(model: Any, common: dict, graphs_on: dict, tiny: bool) -> dict[str, Any]:
    """Graphs on vs off on the same prompts, one stream per row (``per_sample``): the same tokens
    and R3 routes up to the first token where a row's samples part, log-probs within bf16 tolerance."""
    import torch

    from minirl.rollout.native import NativeEngine
    from minirl.types import SamplingParams

    eos = [common["eos_token_id"]]
    kwargs = {**common, "eos_token_id": eos, "sample_seeding": "per_sample"}
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, model.config.vocab_size, (12,), generator=g).tolist() for _ in range(4 if tiny else 16)]
    params = SamplingParams(max_new_tokens=8 if tiny else 32, seed=7)
    off = NativeEngine(model, **kwargs).generate_ids(prompts, 2, params, record_routes=True)
    on = NativeEngine(model, **kwargs, **graphs_on).generate_ids(prompts, 2, params, record_routes=True)
    same_rows = sum(a.completion_ids == b.completion_ids for a, b in zip(off, on))
    compared = routes_equal = 0
    dlogp = 0.0
    for a, b in zip(off, on):
        common_prefix = next((i for i, (x, y) in enumerate(zip(a.completion_ids, b.completion_ids)) if x != y), len(a.completion_ids))
        fed = len(a.prompt_ids) + common_prefix  # positions fed with the same history
        compared += fed
        routes_equal += int((a.routes[:fed] == b.routes[:fed]).all(dim=(-1, -2)).sum())
        if common_prefix:
            dlogp = max(dlogp, float((a.logp_rollout[:common_prefix] - b.logp_rollout[:common_prefix]).abs().max()))
    result = {"rows": len(off), "rows_same_tokens": same_rows, "routes_equal_frac": routes_equal / compared,
              "max_abs_dlogp": dlogp, "bf16_tolerance": 0.05}
    result.update(controlled(NativeEngine(model, **kwargs, **graphs_on), prompts, params, on))
    result["ok"] = result["routes_equal_frac"] == 1.0 and dlogp <= 0.05 and result["control_lengths_ok"]
    return result


def controlled(engine: Any, prompts: list, params: Any, whole: list) -> dict[str, Any]:
    """A partial rollout's call on the graphs (``DecodeControl``): rows with budgets 1-3 short of the limit, stopped
    at the second check of every 2 tokens: each row holds min(4, budget) tokens (EOS is never drawn), the first
    tokens of the uncontrolled call's row where their samples have not parted."""
    from minirl.rollout.base import DecodeControl

    budgets = [params.max_new_tokens - 1 - row % 3 for row in range(len(whole))]
    asked: list[list[bool]] = []

    def stop(ended: list[bool]) -> bool:
        asked.append(ended)
        return len(asked) == 2

    cut = engine.generate_ids(prompts, 2, params, record_routes=True, control=DecodeControl(budgets, stop, 2))
    lengths_ok = [len(c.completion_ids) for c in cut] == [min(4, budget) for budget in budgets] and len(asked) == 2
    same = sum(c.completion_ids == w.completion_ids[: len(c.completion_ids)] for c, w in zip(cut, whole))
    return {"control_lengths_ok": lengths_ok, "control_rows_same_tokens": same}


def part_trainer(tiny: bool, device: str) -> dict[str, Any]:
    import torch

    from minirl.trainer import Trainer
    from minirl.types import Batch

    model = build(tiny, device)
    rows, width = (4, 32) if tiny else (32, 512)  # 16,384 tokens per micro-batch on the GPU
    trainer = Trainer(model, lr=1e-6, micro_batch_sequences=rows, precision="bf16")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, model.config.vocab_size, (rows, width), generator=g)
    mask = torch.ones(rows, width - 1, dtype=torch.bool)
    batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool), mask=mask,
                  logp_rollout=torch.zeros(rows, width - 1), advantages=torch.linspace(-1, 1, rows),
                  group_ids=torch.zeros(rows, dtype=torch.long))

    def objective(logp: torch.Tensor, micro: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return -(logp * micro.advantages[:, None] * micro.mask).sum() / micro.mask.sum(), {}

    trainer.update(batch, objective)  # warm-up
    times = []
    for _ in range(1 if tiny else 3):
        sync(device)
        start = time.perf_counter()
        trainer.update(batch, objective)
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    tokens = rows * width
    flops = 6 * active_parameters(model.config) * tokens / seconds
    return {"tokens_per_update": tokens, "update_s": seconds, "tok_s": tokens / seconds,
            "model_tflop_s": flops / 1e12, "mfu": flops / (PEAK_TFLOPS * 1e12), "peak_tflops": PEAK_TFLOPS,
            "padding_free": padding_free_arm(model, batch, objective, tiny, device),
            "shared_prompt": shared_prompt_arm(model, batch, objective, tiny, device),
            "chunked_head": chunked_head_arm(model, batch, objective, tiny, device)}


def alternate_updates(trainers: dict[Any, Any], batch: Any, objective: Any, tiny: bool, device: str
                      ) -> tuple[dict[Any, float], dict[Any, float | None]]:
    """Each trainer's median seconds of ``update(batch, objective)`` (round 0 warms up; the arms alternate round by
    round), and its peak device memory in GiB (CUDA; else None)."""
    import torch

    times: dict[Any, list[float]] = {arm: [] for arm in trainers}
    peaks: dict[Any, float | None] = {arm: None for arm in trainers}
    for round_ in range(2 if tiny else 4):
        for arm, trainer in trainers.items():
            sync(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            trainer.update(batch, objective)
            sync(device)
            if round_:
                times[arm].append(time.perf_counter() - start)
                peaks[arm] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {arm: statistics.median(t) for arm, t in times.items()}, peaks


def chunked_head_arm(model: Any, batch: Any, objective: Any, tiny: bool, device: str) -> dict[str, Any]:
    """``optim.logprob_chunk_tokens`` against the whole logits on the same update (every position scored, so the
    arms differ in the head alone): update times side by side, each arm's peak device memory (CUDA), the
    log-probs' largest gap."""
    from minirl.trainer import Trainer

    chunk = 64 if tiny else 4096
    trainers = {size: Trainer(model, lr=1e-6, micro_batch_sequences=batch.size, precision="bf16", logprob_chunk_tokens=size)
                for size in (None, chunk)}
    gap = float((trainers[None].score(batch).logp - trainers[chunk].score(batch).logp).abs().max())
    medians, peaks = alternate_updates(trainers, batch, objective, tiny, device)
    whole, chunked = medians[None], medians[chunk]
    return {"chunk_tokens": chunk, "whole_update_s": whole, "chunked_update_s": chunked, "speedup": whole / chunked,
            "whole_peak_gib": peaks[None], "chunked_peak_gib": peaks[chunk], "max_logp_gap": gap}


def padding_free_arm(model: Any, full: Any, objective: Any, tiny: bool, device: str) -> dict[str, Any]:
    """``optim.padding_free`` against the padded update on the same rows cut to lengths from a quarter to all of
    the width (~5/8 real tokens): update times side by side, the log-probs' largest gap, a padding-free update's
    host syncs (CUDA)."""
    import dataclasses

    import torch

    from minirl.trainer import Trainer

    rows, width = full.input_ids.shape
    lengths = torch.linspace(width // 4, width, rows).round().long()
    real = torch.arange(width)[None] < lengths[:, None]
    batch = dataclasses.replace(full, attention_mask=real, mask=real[:, 1:].clone())
    trainers = {free: Trainer(model, lr=1e-6, micro_batch_sequences=rows, precision="bf16", padding_free=free)
                for free in (False, True)}
    gap = float((trainers[False].score(batch).logp - trainers[True].score(batch).logp).abs().max())
    medians, _ = alternate_updates(trainers, batch, objective, tiny, device)
    padded, packed = medians[False], medians[True]
    syncs = host_sync_census(lambda: trainers[True].update(batch, objective)) if device == "cuda" else None
    return {"real_frac": float(real.float().mean()), "padded_update_s": padded, "padding_free_update_s": packed,
            "speedup": padded / packed, "max_logp_gap": gap, "host_syncs": syncs}


def shared_prompt_arm(model: Any, full: Any, objective: Any, tiny: bool, device: str) -> dict[str, Any]:
    """``optim.shared_prompt`` against ``optim.padding_free`` on the same rows recut into groups of G (8; 2 ``--tiny``)
    sharing a prompt of half the width, completions from an eighth to a half of it: update times side by side, the
    tokens each forward computes, the log-probs' largest gap, a shared update's host syncs (CUDA)."""
    import dataclasses

    import torch

    from minirl.models.padding_free import Packing, shared_prompts
    from minirl.trainer import Trainer

    rows, width = full.input_ids.shape
    group, prompt = (2 if tiny else 8), width // 2
    ids = full.input_ids.clone()
    ids[:, :prompt] = ids[::group, :prompt].repeat_interleave(group, dim=0)  # each group's rows: its first row's prompt
    lengths = prompt + torch.linspace(width // 8, width - prompt, rows).round().long()
    real = torch.arange(width)[None] < lengths[:, None]
    targets = real[:, 1:] & (torch.arange(1, width)[None] >= prompt)
    batch = dataclasses.replace(full, input_ids=ids, attention_mask=real, mask=targets,
                                group_ids=torch.arange(rows) // group)
    tokens = {"padding_free": int(real.sum()),
              "shared_prompt": int(Packing.of(real, prompts=shared_prompts(ids, targets)).index.numel())}
    trainers = {arm: Trainer(model, lr=1e-6, micro_batch_sequences=rows, precision="bf16", **{arm: True})
                for arm in tokens}
    gap = float((trainers["padding_free"].score(batch).logp - trainers["shared_prompt"].score(batch).logp).abs().max())
    medians, _ = alternate_updates(trainers, batch, objective, tiny, device)
    free, shared = medians["padding_free"], medians["shared_prompt"]
    syncs = host_sync_census(lambda: trainers["shared_prompt"].update(batch, objective)) if device == "cuda" else None
    return {"group": group, "prompt_tokens": prompt, "padding_free_tokens": tokens["padding_free"],
            "shared_prompt_tokens": tokens["shared_prompt"], "padding_free_update_s": free, "shared_prompt_update_s": shared,
            "speedup": free / shared, "max_logp_gap": gap, "host_syncs": syncs}


def part_lean(tiny: bool, device: str) -> dict[str, Any]:
    """fp32 forward + backward of one micro-batch: the transformers forward against the module-stack-free
    probe of ``benchmarks/lean_forward.py`` (bitwise the same on a CPU, no faster there), alternating, with
    each one's host syncs (CUDA): the probe has no mask plumbing, so it skips transformers' per-forward
    packed-sequence check."""
    import torch

    from minirl.algo import token_logprobs

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from lean_forward import LeanForward, lean_unsupported_reason

    model = build(tiny, device)
    model.train()
    reason = lean_unsupported_reason(model)
    if reason is not None:
        return {"lean": f"not run: {reason}"}
    rows, width = (4, 32) if tiny else (16, 512)
    ids = torch.randint(2, model.config.vocab_size, (rows, width), generator=torch.Generator().manual_seed(0)).to(device)
    forwards = {"transformers": lambda x: model(input_ids=x, use_cache=False).logits, "lean": LeanForward(model)}

    def train_pass(name: str) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(forwards[name](ids)[:, :-1].float(), ids[:, 1:])
        logp.sum().backward()
        return logp.detach()

    gap = (train_pass("transformers") - train_pass("lean")).abs().max().item()
    times: dict[str, list[float]] = {name: [] for name in forwards}
    for _ in range(2 if tiny else 5):
        for name in forwards:
            sync(device)
            start = time.perf_counter()
            train_pass(name)
            sync(device)
            times[name].append(time.perf_counter() - start)
    result: dict[str, Any] = {"rows": rows, "width": width, "max_logp_gap": gap}
    for name, values in times.items():
        result[f"{name}_s"] = statistics.median(values)
        if device == "cuda":
            result[f"{name}_host_syncs"] = host_sync_census(lambda name=name: train_pass(name))
    result["lean_speedup"] = result["transformers_s"] / result["lean_s"]
    return result


def part_rl_step(tiny: bool, device: str, offload: bool = False) -> dict[str, Any]:
    import tempfile

    import minirl.loop as loop
    from minirl.config import load_config
    from minirl.models.tokenizer import build_char_tokenizer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import PartialCredit

    directory = Path(tempfile.mkdtemp())
    model = build(tiny, "cpu")
    model.save_pretrained(directory / "model")
    build_char_tokenizer().save_pretrained(directory / "model")
    rows = (2, 4, 8) if tiny else (16, 8, 128)
    cfg = load_config(ROOT / "configs/demo.yaml", [
        f"model.path={directory / 'model'}", "cold_start.enabled=false", "log.console=false",
        f"rollout.prompts_per_step={rows[0]}", f"rollout.samples_per_prompt={rows[1]}", f"rollout.max_new_tokens={rows[2]}",
        "rollout.precision=bf16", "moe.routing_replay=R3", "optim.minibatches_per_step=2", "optim.precision=bf16",
        f"optim.micro_batch_sequences={rows[0] * rows[1]}", f"cluster.device={device}", f"run.output_dir={directory}",
        "run.threads=0", "task.num_train_prompts=64", "task.num_eval_prompts=4",
        f"rollout.cuda_graphs={str(GRAPHS and device == 'cuda').lower()}", f"optim.cpu_offload={str(offload).lower()}",
    ])  # fmt: skip
    run = loop.setup(cfg, rewards=PartialCredit())  # an untrained model: dense rewards, non-zero advantages
    try:
        loop.global_step(run, 1)  # warm-up
        sync(device)
        start = time.perf_counter()
        metrics = loop.global_step(run, 2)
        sync(device)
        seconds = time.perf_counter() - start
        layout = run.trainer._all("memory_layout")[0] if offload else None  # the rank's, its peak after two steps
        syncs = host_sync_census(lambda: loop.global_step(run, 3)) if device == "cuda" and not offload else None
    finally:
        run.close()
    keep = {k: v for k, v in metrics.items() if k.startswith(("time/", "mismatch/kl_k3", "routing/"))}
    peak = round(torch_peak_gib(device), 2)  # this process: the engine, and the trainer unless it is offloaded
    return {"global_step_s": seconds, "rows": rows[0] * rows[1], "max_new_tokens": rows[2],
            "cuda_graphs": cfg.rollout.cuda_graphs, "host_syncs": syncs, "process_peak_gib": peak,
            **({"rank": layout} if offload else {}), **keep}


def part_offload(tiny: bool, device: str) -> dict[str, Any]:
    return part_rl_step(tiny, device, offload=True)


def torch_peak_gib(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0


def host_sync_census(work: Any) -> dict[str, Any]:
    """Every host synchronisation ``work()`` makes on CUDA (``torch.cuda.set_sync_debug_mode("warn")``),
    counted by the Python line that made it: where the decode loop and the update still wait for the GPU
    (issue 20 asks for none inside either)."""
    import warnings
    from collections import Counter

    import torch

    sites: Counter[str] = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            work()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for warning in caught:
        if "synchronizing" in str(warning.message):
            sites[f"{Path(warning.filename).name}:{warning.lineno}"] += 1
    return {"total": sum(sites.values()), "by_site": dict(sites.most_common(25))}


def part_trace(tiny: bool, device: str) -> dict[str, Any]:
    import tempfile

    config = ROOT / "experiments/stress/trace/n8_minirl_r3.yaml"
    overrides = [f"cluster.device={device}", f"run.output_dir={tempfile.mkdtemp()}", "run.overwrite=true", "log.console=false",
                 f"rollout.cuda_graphs={str(GRAPHS and device == 'cuda').lower()}"]
    if tiny:
        overrides += ["model.preset=qwen3-moe-tiny", "optim.global_steps=1", "cold_start.steps=2", "cold_start.until_loss=null",
                      "eval.num_prompts=2", "eval.samples_per_prompt=1", "rollout.prompts_per_step=2", "task.num_eval_prompts=2",
                      "cold_start.cache_dir=null"]  # fmt: skip
    command = [sys.executable, "-c", "import sys; from minirl.cli import main; sys.exit(main())", "train", str(config), *overrides]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"trace arm exit {done.returncode}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return {"wall_s": seconds, "command": " ".join(["minirl train", str(config.relative_to(ROOT)), *overrides])}


PEAK_TFLOPS = 790.0
GRAPHS = True  # --cuda-graphs: rollout.cuda_graphs for the RL step and the trace arm (CUDA only)
RUNNERS = {"engine": part_engine, "trainer": part_trainer, "lean": part_lean, "rl_step": part_rl_step, "trace": part_trace,
           "offload": part_offload}


def run_parts(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Each part in its own child process and timeout; a failure or timeout is recorded, not fatal."""
    results: dict[str, Any] = {}
    for name in args.parts.split(","):
        command = [sys.executable, __file__, "--part", name, "--out", str(out), "--device", args.device,
                   "--peak-tflops", str(args.peak_tflops), "--cuda-graphs", args.cuda_graphs, *(["--tiny"] if args.tiny else [])]
        timeout = TIMEOUT_S[name] * (4 if args.tiny else 1)
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            path = out / f"part_{name}.json"
            if done.returncode == 0 and path.is_file():
                results[name] = json.loads(path.read_text())
            else:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                results[name] = {"error": f"exit {done.returncode}", "tail": tail}
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"timed out after {timeout} s"}
        results[name]["part_wall_s"] = round(time.perf_counter() - start, 1)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    global PEAK_TFLOPS, GRAPHS
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model, small shapes: runs on CPU in about a minute")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--part", choices=PARTS + OPTIONAL_PARTS, help=argparse.SUPPRESS)  # internal: one part, in this process
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS)
    parser.add_argument("--cuda-graphs", choices=["on", "off"], default="on",
                        help="rollout.cuda_graphs in the RL step and the trace arm (the engine part measures both)")
    args = parser.parse_args(argv)
    PEAK_TFLOPS, GRAPHS = args.peak_tflops, args.cuda_graphs == "on"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part:
        if args.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        result = RUNNERS[args.part](args.tiny, args.device)
        (out / f"part_{args.part}.json").write_text(json.dumps(result, indent=1, default=str))
        return 0
    from minirl.runtime import environment

    started = time.perf_counter()
    results = {"environment": environment(), "tiny": args.tiny, "device": args.device,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results.update(run_parts(args, out))
    results["total_wall_s"] = round(time.perf_counter() - started, 1)
    (out / "gpu_bench.json").write_text(json.dumps(results, indent=1, default=str))
    print(summary(results))
    agreed = results.get("engine", {}).get("agreement", {}).get("ok", True)
    return 0 if agreed and all("error" not in results[name] for name in args.parts.split(",")) else 1


def summary(results: dict[str, Any]) -> str:
    """The side-by-side lines the issue asks for."""
    lines = [f"gpu_bench on {results['environment'].get('cuda') or results['environment'].get('cpu')} "
             f"({'tiny' if results['tiny'] else '~0.9 B Qwen3-MoE'}), {results['date']}"]
    engine = results.get("engine", {})
    for shape, row in engine.items():
        if isinstance(row, dict) and "hf_tok_s" in row:
            lines.append(f"  rollout {shape}: HF generate {row['hf_tok_s']:,.0f} tok/s; engine graphs off "
                         f"{row['graphs_off_tok_s']:,.0f} ({row['graphs_off_over_hf']:.2f}x), graphs on {row['graphs_on_tok_s']:,.0f} "
                         f"({row['graphs_on_over_hf']:.2f}x); R3 recording (graphs on) {100 * row['r3_overhead_frac']:+.1f} %")
    if "agreement" in engine:
        lines.append(f"  graphs on vs off: {engine['agreement']}")
    trainer = results.get("trainer", {})
    if "mfu" in trainer:
        lines.append(f"  trainer bf16: {trainer['tok_s']:,.0f} tok/s, {trainer['model_tflop_s']:.1f} TFLOP/s, "
                     f"MFU {100 * trainer['mfu']:.1f} % of {trainer['peak_tflops']:.0f}")
        free = trainer["padding_free"]
        lines.append(f"  padding-free update ({100 * free['real_frac']:.0f} % real tokens): padded {free['padded_update_s']:.3f} s, "
                     f"padding-free {free['padding_free_update_s']:.3f} s ({free['speedup']:.2f}x), max |logp gap| "
                     f"{free['max_logp_gap']:.1e}; host syncs {free['host_syncs']['total'] if free['host_syncs'] else 'n/a'}")
        shared = trainer["shared_prompt"]
        lines.append(f"  shared prompts (G = {shared['group']}, {shared['prompt_tokens']}-token prompts): padding-free "
                     f"{shared['padding_free_update_s']:.3f} s on {shared['padding_free_tokens']} tokens, shared "
                     f"{shared['shared_prompt_update_s']:.3f} s on {shared['shared_prompt_tokens']} ({shared['speedup']:.2f}x), "
                     f"max |logp gap| {shared['max_logp_gap']:.1e}; host syncs "
                     f"{shared['host_syncs']['total'] if shared['host_syncs'] else 'n/a'}")
        head = trainer["chunked_head"]
        memory = (f"; peak {head['whole_peak_gib']:.1f} -> {head['chunked_peak_gib']:.1f} GiB"
                  if head["whole_peak_gib"] is not None else "")
        lines.append(f"  chunked LM head ({head['chunk_tokens']} tokens a chunk): whole logits {head['whole_update_s']:.3f} s, "
                     f"chunked {head['chunked_update_s']:.3f} s ({head['speedup']:.2f}x){memory}, max |logp gap| "
                     f"{head['max_logp_gap']:.1e}")
    lean = results.get("lean", {})
    if "lean_speedup" in lean:
        syncs = {k: v["total"] for k, v in lean.items() if k.endswith("_host_syncs") and v}
        lines.append(f"  fp32 forward + backward {lean['rows']} x {lean['width']}: transformers {lean['transformers_s'] * 1000:.1f} ms, "
                     f"lean probe {lean['lean_s'] * 1000:.1f} ms ({lean['lean_speedup']:.2f}x), max |logp gap| "
                     f"{lean['max_logp_gap']:.1e}; host syncs {syncs or 'n/a'}")
    elif "lean" in lean:
        lines.append(f"  lean probe: {lean['lean']}")
    if "global_step_s" in results.get("rl_step", {}):
        lines.append(f"  one RL global step (R3, N = 2): {results['rl_step']['global_step_s']:.2f} s")
        syncs = results["rl_step"].get("host_syncs")
        if syncs:
            lines.append(f"  host syncs in one global step: {syncs['total']} (most: {list(syncs['by_site'].items())[:6]})")
    if "wall_s" in results.get("trace", {}):
        lines.append(f"  trace arm: {results['trace']['wall_s']:.1f} s wall")
    offload = results.get("offload", {})
    if "global_step_s" in offload:
        plain = results.get("rl_step", {})
        beside = (f" (in process: {plain['global_step_s']:.2f} s, {plain['process_peak_gib']} GiB peak with the engine)"
                  if "global_step_s" in plain else "")
        lines.append(f"  the RL step with optim.cpu_offload: {offload['global_step_s']:.2f} s, the rank's peak "
                     f"{offload['rank']['peak_device_gib']} GiB, its parameters stored on {offload['rank']['stored']}, "
                     f"the engine's process {offload['process_peak_gib']} GiB{beside}")
    lines += [f"  {name}: {results[name]['error']}" for name in PARTS + OPTIONAL_PARTS if "error" in results.get(name, {})]
    lines.append(f"  total {results['total_wall_s']} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
