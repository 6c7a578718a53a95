"""The bucketed static-cache decode (``minirl.rollout.graph_decode``), run eagerly on the CPU against
the engine's dynamic loop: same tokens, finish reasons and R3 routes; log-probs of the law actually
sampled; rows really move to smaller buckets. (The CUDA-graph capture itself runs only on a GPU:
``benchmarks/gpu_bench.py`` checks graphs on against graphs off there.)"""

from __future__ import annotations

import collections
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import minirl
import minirl.rollout.graph_decode as graph_decode
from minirl.rollout.graph_decode import BucketDecoder, bucket_sizes
from minirl.rollout.native import NativeEngine
from minirl.types import SamplingParams
from tests.unit.test_rollout_native import PAD, PROMPTS, dense_model, moe_model

STOP = [1, 2, 3, 4, 5, 6]  # ~10 % of the vocabulary ends a row: rows leave at many different steps
PARAMS = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=5)


def pair(model, **kwargs) -> tuple[NativeEngine, NativeEngine]:
    kwargs = {"eos_token_id": STOP, "pad_token_id": PAD, "sample_seeding": "per_sample", "half_gemm": "native", **kwargs}
    return NativeEngine(model, **kwargs), NativeEngine(model, decode_path="static", **kwargs)


def test_bucket_sizes_are_powers_of_two_down_to_one():
    assert bucket_sizes(12) == [16, 8, 4, 2, 1]
    assert bucket_sizes(16) == [16, 8, 4, 2, 1]
    assert bucket_sizes(1) == [1]


def assert_same_samples(dynamic, static, atol: float) -> None:
    assert [c.completion_ids for c in static] == [c.completion_ids for c in dynamic]
    assert [c.finish_reason for c in static] == [c.finish_reason for c in dynamic]
    for a, b in zip(dynamic, static):
        assert (a.routes is None) == (b.routes is None)
        if a.routes is not None:
            assert torch.equal(a.routes, b.routes)  # -1 after each row's last fed token, as the dynamic loop
        # the bucket computes more rows than the dynamic batch: GEMM rounding of another row count only
        torch.testing.assert_close(b.logp_rollout, a.logp_rollout, rtol=0, atol=atol)


@pytest.mark.parametrize("precision, kv_cache", [("fp32", "same"), ("bf16", "same"), ("fp8_e4m3", "fp8_e4m3"), ("fp4_e2m1", "same")])
@pytest.mark.parametrize("full_length", [False, True], ids=["sliced", "full-length"])
def test_static_buckets_sample_what_the_dynamic_loop_samples(monkeypatch, precision, kv_cache, full_length):
    """``full_length`` is the captured step's attention (the whole static cache under the key mask)."""
    if precision == "bf16" and full_length:
        pytest.skip("bf16 full-length attention rounds differently enough to flip near-tied routes (GPU check)")
    model = moe_model(std=0.3)
    kwargs = {"precision": precision, "kv_cache_precision": kv_cache, **({"fp4_block_size": 16} if precision == "fp4_e2m1" else {})}
    dynamic, static = pair(model, **kwargs)
    static._buckets.full_length = full_length
    sizes: list[int] = []
    make_bucket = BucketDecoder._bucket
    monkeypatch.setattr(BucketDecoder, "_bucket", lambda self, size, *a: sizes.append(size) or make_bucket(self, size, *a))
    a = dynamic.generate_ids(PROMPTS, 8, PARAMS, record_routes=True)
    b = static.generate_ids(PROMPTS, 8, PARAMS, record_routes=True)
    # an fp8 KV cache read over the whole static cache rounds differently on AVX512 kernels: 6.6e-5 measured on an
    # AVX512 Xeon (2026-12-05), < 1e-5 on AVX2; the tokens and routes are still the same
    assert_same_samples(a, b, atol=1e-4 if kv_cache != "same" and full_length else 1e-5)
    assert sizes[0] == 32 and len(sizes) >= 3 and sizes == sorted(sizes, reverse=True), sizes  # rows moved down
    assert len({len(c.completion_ids) for c in a}) > 3


def test_dense_models_and_unpadded_prompts_too():
    dynamic, static = pair(dense_model(std=0.3))
    assert_same_samples(dynamic.generate_ids([[3, 4, 5], [7, 8, 9]], 3, PARAMS),
                        static.generate_ids([[3, 4, 5], [7, 8, 9]], 3, PARAMS), atol=1e-5)


@pytest.mark.parametrize("family", ["olmoe", "mixtral", "qwen2_moe", "glm4_moe", "deepseek_v3", "glm4_moe_lite", "dots1",
                                    "deepseek_v2", "minimax_m2", "gpt_oss", "qwen3_5_moe",
                                    "qwen3_next", "ernie4_5_moe", "granitemoe",
                                    "hunyuan_moe"])
def test_the_other_moe_families_run_in_buckets_too(family):
    """OLMoE's whole-projection q/k norm, Mixtral's fp32 top-k weights, Qwen2-MoE's shared expert and dense layer:
    the buckets' step is the fast decoder's, so they sample what the dynamic loop samples, routes and all."""
    from tests.unit import test_fast_decode as families

    model = getattr(families, f"{family}_model")(std=0.3)
    dynamic, static = pair(model)
    assert_same_samples(dynamic.generate_ids(PROMPTS, 8, PARAMS, record_routes=True),
                        static.generate_ids(PROMPTS, 8, PARAMS, record_routes=True), atol=1e-5)


def test_gpt_oss_sliding_layers_over_the_whole_static_length():
    """The captured step attends over the whole static cache: GPT-OSS's sliding layers mask the columns older than
    their window instead of slicing them away, and sample what the dynamic loop samples."""
    from tests.unit.test_fast_decode import gpt_oss_model

    dynamic, static = pair(gpt_oss_model(std=0.3))
    static._buckets.full_length = True
    # the products over the longer rows of keys round otherwise (1.0e-5 seen on an AVX512 Xeon): the same tokens and
    # routes, log-probs within the whole-length tolerance of the fp8 arm above
    assert_same_samples(dynamic.generate_ids(PROMPTS, 8, PARAMS, record_routes=True),
                        static.generate_ids(PROMPTS, 8, PARAMS, record_routes=True), atol=1e-4)


def test_per_batch_seeding_draws_from_the_law_it_reports():
    """One noise tensor covers the bucket, so the draws are not the dynamic loop's; each reported
    log-prob is still that of the tempered, truncated law the token was drawn from."""
    _, static = pair(moe_model(std=0.3), sample_seeding="per_batch")
    completions = static.generate_ids(PROMPTS, 4, PARAMS)
    scored = static.score_ids([c.prompt_ids for c in completions], [c.completion_ids for c in completions], PARAMS)
    for completion, logp in zip(completions, scored):
        torch.testing.assert_close(completion.logp_rollout, logp, rtol=0, atol=1e-5)
        assert torch.isfinite(completion.logp_rollout).all()


def test_the_switch_is_clean_on_a_cpu():
    model = moe_model()
    assert NativeEngine(model, eos_token_id=1, pad_token_id=PAD, cuda_graphs=True)._buckets is None  # no effect on CPU
    with pytest.raises(ValueError, match="full static length"):
        BucketDecoder(NativeEngine(model, eos_token_id=1, pad_token_id=PAD)._fast, graphs=True, full_length=False)
    with pytest.raises(ValueError, match="grouped GEMM"):
        BucketDecoder(NativeEngine(model, eos_token_id=1, pad_token_id=PAD)._fast, graphs=True)
    assert graph_decode.BucketDecoder is BucketDecoder


# ----------------------------------------------------------------------------- what a capture forbids

# aten ops that wait for the device (a value read on the host) or whose output shape depends on the data: each
# breaks a CUDA-graph capture, and each syncs the host inside an eager CUDA decode loop
WAITING_OPS = {"aten._local_scalar_dense.default", "aten.item.default", "aten.is_nonzero.default", "aten.equal.default",
               "aten.allclose.default", "aten.nonzero.default",
               "aten.masked_select.default", "aten.bincount.default", "aten.repeat_interleave.Tensor",
               "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default"}


_PACKAGE = str(Path(minirl.__file__).parent) + os.sep  # as its modules' co_filename spell it


class _WaitCensus(TorchDispatchMode):
    """Counts, by the minirl function and line that issued it, every waiting op (and every index by a boolean
    mask, whose shape depends on the data) dispatched while ``on``, and every ``tolist`` / ``numpy`` / ``cpu`` (which
    a CPU tensor answers without a dispatch; ``watch_host_copies``)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: collections.Counter = collections.Counter()
        self.on = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        indices = [index for arg in args if isinstance(arg, (list, tuple)) for index in arg]
        masked = name.startswith("aten.index") and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        if name in WAITING_OPS or masked:
            self.count(name)
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> None:
        if not self.on:
            return
        frame = sys._getframe(2)
        while frame is not None and not frame.f_code.co_filename.startswith(_PACKAGE):  # minirl's own code, not a
            frame = frame.f_back  # library's (a checkout's .venv may sit under a directory named minirl)
        site = "?" if frame is None else f"{frame.f_code.co_name}:{frame.f_lineno}"
        self.sites[f"{name} in {site}"] += 1

    def watch_host_copies(self, monkeypatch) -> None:
        for method in ("tolist", "numpy", "cpu"):
            original = getattr(torch.Tensor, method)

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                self.count(f"Tensor.{_method}")
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, method, counted)


@pytest.mark.parametrize("precision, kv_cache, penalty", [("bf16", "same", 1.0), ("fp8_e4m3", "fp8_e4m3", 1.0),
                                                         ("fp4_e2m1", "same", 1.3)])
def test_the_captured_step_and_the_decode_loop_never_wait_for_the_device(monkeypatch, precision, kv_cache, penalty):
    """The CUDA path's shape of the loop on a CPU (the whole-length step, the device-side grouped GEMM experts, R3
    routes recorded, top-p and a repetition penalty): no op of the step a bucket captures waits for the device or
    has a data-dependent shape, and the loop around it waits only where the module says, reading the running count
    (non-blocking on CUDA; read at once here) and moving to a smaller bucket."""
    census = _WaitCensus()
    census.watch_host_copies(monkeypatch)
    steps: list[int] = []
    for name in ("_step", "decode"):
        original = getattr(BucketDecoder, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            census.on = True
            steps.extend([1] if _name == "_step" else [])
            before = collections.Counter(census.sites)
            try:
                return _original(self, *args, **kwargs)
            finally:
                census.on = _name == "_step"  # back inside the loop after a step
                if _name == "_step":
                    assert census.sites == before, f"the captured step waits: {census.sites - before}"

        monkeypatch.setattr(BucketDecoder, name, counted)
    kwargs = {"precision": precision, "kv_cache_precision": kv_cache, **({"fp4_block_size": 16} if precision == "fp4_e2m1" else {})}
    engine = NativeEngine(moe_model(std=0.3), eos_token_id=STOP, pad_token_id=PAD, decode_path="static", **kwargs)
    engine._buckets.full_length = True
    engine._buckets.fast.grouped_mm = True  # the experts a capture needs (the default only for bf16 on CUDA)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=5, repetition_penalty=penalty)
    with census:
        engine.generate_ids(PROMPTS, 8, params, record_routes=True)
    census.on = False
    assert len(steps) >= 20
    reads = {site: n for site, n in census.sites.items() if site.endswith(f"in read:{_COUNT_READ_LINE}")}
    changes = {site: n for site, n in census.sites.items()  # the rows kept, and the host's list of them
               if "aten.nonzero.default in decode:" in site or "Tensor.tolist in _bucket:" in site}
    assert set(census.sites) == set(reads) | set(changes), census.sites  # nothing else waits
    assert sum(reads.values()) <= len(steps) and 2 <= sum(changes.values()) <= 2 * len(bucket_sizes(len(PROMPTS) * 8))


_COUNT_READ_LINE = next(number for number, line in enumerate(inspect.getsource(graph_decode).splitlines(), start=1)
                        if "return int(alive.sum())" in line)
