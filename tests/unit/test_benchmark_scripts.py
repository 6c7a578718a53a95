"""The pure parts of the benchmark scripts: fits, thresholds, argument parsing (no timing asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_async  # noqa: E402
import bench_micro_batches  # noqa: E402
import bench_partial  # noqa: E402
import bench_scaling  # noqa: E402
import bench_shared_prompt  # noqa: E402
import bench_step  # noqa: E402
import compare_trl  # noqa: E402
import gpu_bench  # noqa: E402
import lean_forward  # noqa: E402
import peak_memory  # noqa: E402
import profile_step  # noqa: E402
import time_to_quality  # noqa: E402

# ----------------------------------------------------------------------------- bench_scaling


def test_linear_fit_recovers_an_exact_line():
    fit = bench_scaling.linear_fit([2, 4, 8, 16], [0.1 + 0.05 * x for x in (2, 4, 8, 16)])
    assert fit.intercept == pytest.approx(0.1)
    assert fit.slope == pytest.approx(0.05)
    assert fit.max_deviation == pytest.approx(0.0, abs=1e-12)
    assert bench_scaling.flagged_points(fit) == []
    assert fit.predict(32) == pytest.approx(1.7)


def test_linear_fit_deviation_is_relative_to_the_measured_value():
    xs, ys = [1, 2, 3], [1.0, 2.0, 6.0]  # least squares: y = -2 + 2.5 x -> 0.5, 3.0, 5.5
    fit = bench_scaling.linear_fit(xs, ys)
    assert fit.slope == pytest.approx(2.5)
    assert fit.intercept == pytest.approx(-2.0)
    assert fit.deviations == pytest.approx([0.5, -0.5, 0.5 / 6])
    assert fit.max_deviation == pytest.approx(0.5)
    assert bench_scaling.flagged_points(fit, 0.15) == [0, 1]


def test_quadratic_growth_is_flagged_and_linear_noise_is_not():
    xs = [8, 16, 32, 64]
    curved = bench_scaling.linear_fit(xs, [0.01 * x * x for x in xs])
    assert bench_scaling.flagged_points(curved, 0.15)  # x^2 over 8..64 is far from a line
    noisy = bench_scaling.linear_fit(xs, [(0.2 + 0.01 * x) * (1 + e) for x, e in zip(xs, (0.03, -0.02, 0.01, -0.01))])
    assert bench_scaling.flagged_points(noisy, 0.15) == []


def test_linear_fit_needs_two_distinct_x():
    with pytest.raises(ValueError):
        bench_scaling.linear_fit([4, 4], [1.0, 2.0])
    with pytest.raises(ValueError):
        bench_scaling.linear_fit([1, 2], [1.0])


def test_bending_phase_names_the_non_linear_phase():
    xs = [2.0, 4.0, 8.0, 16.0]
    phases = {"rollout": [0.1 * x for x in xs], "update": [0.5, 0.5, 0.5, 3.0], "sync": [0.01] * 4}
    phase, residual = bench_scaling.bending_phase(xs, phases, 3)
    assert phase == "update" and residual > 0


def test_axis_summary_flags_with_the_phase():
    points = [{"value": v, "step_s": s, "phases_s": {p: s / 4 for p in bench_scaling.PHASES}}
              for v, s in ((2, 1.0), (4, 1.0), (8, 1.0), (16, 5.0))]
    points[3]["phases_s"]["update"] = 4.0
    summary = bench_scaling.axis_summary("G", points, 0.15)
    assert not summary["linear"]
    assert summary["flagged"] and summary["max_deviation"] > 0.15
    assert {flag["phase"] for flag in summary["flagged"]} == {"update"}  # the jump is all in the update
    assert summary["phase_slopes_s"]["update"] > summary["phase_slopes_s"]["rollout"]


def test_bench_scaling_arguments():
    args = bench_scaling.parse_args([])
    assert args.axes == {"G": [2, 4, 8, 16], "P": [2, 4, 8, 16], "T": [8, 16, 32, 64]}
    assert (args.steps, args.threads, args.tolerance) == (5, 1, 0.15)
    args = bench_scaling.parse_args(["--G", "2,8", "--P", "", "--T", "", "--steps", "3", "rollout.precision=fp32"])
    assert args.axes == {"G": [2, 8]} and args.steps == 3 and args.overrides == ["rollout.precision=fp32"]
    with pytest.raises(SystemExit):
        bench_scaling.parse_args(["--G", "4"])  # one value: no line
    with pytest.raises(SystemExit):
        bench_scaling.parse_args(["--G", "", "--P", "", "--T", ""])


# ----------------------------------------------------------------------------- bench_rollout


def test_bench_rollout_arguments_and_sweep_points():
    import bench_rollout

    args = bench_rollout.parse_args([])
    assert not args.sweep and args.threads == 2 and args.repeats == 5  # the default mode is unchanged
    assert args.half_gemm == "auto" and bench_rollout.parse_args(["--half-gemm", "native"]).half_gemm == "native"
    hf_model, engine = bench_rollout.build_samplers("bf16", torch.bfloat16, 0.0, True, half_gemm="native")
    assert engine.half_gemm == "native" and not engine._fast.fp32_gemm and hf_model.dtype == torch.bfloat16
    assert bench_rollout.resolved_half_gemm("fp32") == "fp32"
    args = bench_rollout.parse_args(["--sweep", "--batches", "1,8", "--lengths", "4", "--out", "x.json"])
    assert args.batches == [1, 8] and args.lengths == [4] and args.length == 64 and args.batch == 32
    assert bench_rollout.sweep_points([1, 8], 64, [4], 32) == [("batch", 1, 64), ("batch", 8, 64), ("length", 32, 4)]
    with pytest.raises(SystemExit):
        bench_rollout.parse_args(["--plot", "x.png"])  # --plot belongs to --sweep
    with pytest.raises(SystemExit):
        bench_rollout.parse_args(["--sweep", "--lengths", "600"])  # beyond the model's context


# ----------------------------------------------------------------------------- time_to_quality


def test_time_to_threshold_is_the_first_point_at_or_above():
    curve = [{"step": 20, "seconds": 9.0, "accuracy": 0.95}, {"step": 0, "seconds": 0.0, "accuracy": 0.8},
             {"step": 10, "seconds": 4.5, "accuracy": 0.9}, {"step": 30, "seconds": 13.0, "accuracy": 0.85}]
    assert time_to_quality.time_to_threshold(curve, 0.9)["seconds"] == 4.5
    assert time_to_quality.time_to_threshold(curve, 0.8)["step"] == 0
    assert time_to_quality.time_to_threshold(curve, 0.96) is None
    assert time_to_quality.time_to_threshold([], 0.5) is None
    assert time_to_quality.describe(None) == "never"


def test_minirl_curve_sums_step_times_up_to_each_evaluation():
    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "time/step_s": 1.5}, {"step": 2, "time/step_s": 2.0,
            "eval/accuracy": 0.6}, {"step": 3, "time/step_s": 1.0}, {"step": 4, "time/step_s": 0.5, "eval/accuracy": 0.7}]
    assert time_to_quality.minirl_curve(rows) == [
        {"step": 0, "seconds": 0.0, "accuracy": 0.5}, {"step": 2, "seconds": 3.5, "accuracy": 0.6},
        {"step": 4, "seconds": 5.0, "accuracy": 0.7},
    ]


def test_trl_reward_is_the_synthetic_tasks_reward():
    from minirl.config import TaskConfig
    from minirl.tasks import build_task_from_config

    namespace: dict = {}
    exec(time_to_quality.TRL_REWARD, namespace)
    trl_reward = namespace["exact_answer_reward"]
    task = build_task_from_config(TaskConfig(kind="reverse", difficulty=4, num_train_prompts=8, num_eval_prompts=2))
    prompt = task.train_prompts()[0]
    completions = [f"#### {prompt.answer}", f"x #### {prompt.answer} ", f"#### {prompt.answer}x", prompt.answer,
                   f"#### zz #### {prompt.answer}", f"#### {prompt.answer} #### ", ""]
    expected = [task.reward(prompt, c) for c in completions]
    assert trl_reward([prompt.text] * len(completions), completions, [prompt.answer] * len(completions)) == expected
    assert expected[:3] == [1.0, 1.0, 0.0]


def test_time_to_quality_arguments():
    args = time_to_quality.parse_args([])
    assert (args.steps, args.eval_every, args.threshold, args.threads) == (100, 10, 0.9, 1)
    args = time_to_quality.parse_args(["--quick", "optim.lr=1e-3"])
    assert (args.steps, args.eval_every) == (3, 1)
    assert args.overrides[: len(time_to_quality.QUICK)] == time_to_quality.QUICK
    assert args.overrides[-1] == "optim.lr=1e-3"  # the user's overrides win
    with pytest.raises(SystemExit):
        time_to_quality.parse_args(["--threshold", "1.5"])
    with pytest.raises(SystemExit):
        time_to_quality.parse_args(["--eval-every", "0"])


def test_quick_overrides_make_a_valid_config():
    from minirl.config import load_config

    cfg = load_config(time_to_quality.parse_args(["--quick"]).config, time_to_quality.QUICK)
    assert cfg.model.preset == "qwen3-moe-tiny" and cfg.global_batch_sequences == 4


# ----------------------------------------------------------------------------- peak_memory


def test_bench_step_config_loads(tmp_path):
    """The step benchmark's own overrides are current config keys (it once spelled a renamed one)."""
    cfg = bench_step.step_config("configs/demo.yaml", 5, str(tmp_path), ["optim.minibatches_per_step=4"])
    assert (cfg.optim.global_steps, cfg.cold_start.enabled, cfg.optim.minibatches_per_step) == (5, False, 4)


def test_bench_async_runs_each_arm_and_reads_its_phases(tmp_path):
    """One arm of the asynchronous benchmark on the tiny model: every phase it prints is in the run's metrics."""
    tiny = ["model.preset=qwen3-moe-tiny", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=4", "run.threads=1"]
    phases = bench_async.one_run("configs/demo.yaml", 4, [*tiny, "rollout.async_steps=1"])
    assert set(phases) == set(bench_async.PHASES) and phases["step"] > 0 and phases["rollout"] > 0


def test_bench_partial_arms_are_valid_configs_and_one_runs():
    """The partial-rollout benchmark's arms load (its pool of P is no over-sampling, 2P is), and one runs on the tiny
    model, with every key it prints in the run's metrics, one call a step or (the wrapped source) one per chunk."""
    from minirl.config import load_config

    table = bench_partial.arms(8, 4)
    pools = [load_config("configs/demo.yaml", extra).rollout.partial_pool_prompts for extra, _ in table.values()]
    assert list(table) == ["whole", "P, one call", "P, chunk calls", "2P, one call", "2P, chunk calls", "2P, async 1"]
    assert pools == [None, 8, 8, 16, 16, 16]
    assert [per_chunk for _, per_chunk in table.values()] == [False, False, True, False, True, False]
    assert load_config("configs/demo.yaml", table["2P, async 1"][0]).rollout.async_steps == 1
    tiny = ["model.preset=qwen3-moe-tiny", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
            "rollout.max_new_tokens=8", "run.threads=1"]
    extra, _ = bench_partial.arms(2, 2)["2P, one call"]
    one, chunked = (bench_partial.one_run("configs/demo.yaml", 3, [*tiny, *extra], "", per_chunk) for per_chunk in (False, True))
    assert set(one) == set(bench_partial.KEYS) and one["time/rollout_s"] >= 0 and one["time/step_s"] > 0
    assert one["rollout/chunks"] == 1.0 and chunked["rollout/chunks"] > 1.0


def test_peak_memory_arguments():
    args = peak_memory.parse_args([])
    assert [name for name, _ in args.job_list] == ["demo", "20m"]
    assert args.job_list[0][1] == ["train", "configs/demo.yaml"]  # exactly `make demo`
    assert "model.preset=qwen3-moe-20m" in args.job_list[1][1]
    args = peak_memory.parse_args(["--jobs", "--job", "mine=train configs/grpo.yaml optim.global_steps=5"])
    assert args.job_list == [("mine", ["train", "configs/grpo.yaml", "optim.global_steps=5"])]
    with pytest.raises(SystemExit):
        peak_memory.parse_args(["--job", "no-equals-sign"])
    with pytest.raises(SystemExit):
        peak_memory.parse_args(["--jobs"])  # nothing to run


def test_peak_memory_of_a_small_child(tmp_path):
    command = [sys.executable, "-c", "x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096])"]
    result = peak_memory.run_job("alloc", command, 0.05, tmp_path / "alloc.log")
    assert result.exit_code == 0
    assert result.peak_rss_mib >= 64  # the kernel's high-water mark sees the 64 MiB buffer
    assert result.processes >= 1
    command = peak_memory.job_command(["train", "c.yaml"], tmp_path, "x")
    assert command[1:] == ["-m", "minirl.cli", "train", "c.yaml", f"run.output_dir={tmp_path / 'x'}"]


# ----------------------------------------------------------------------------- plots (files written, no pixels checked)


def test_plots_are_written(tmp_path):
    import bench_rollout

    curves = {"minirl": [{"step": 0, "seconds": 0.0, "accuracy": 0.8}, {"step": 10, "seconds": 5.0, "accuracy": 0.92}],
              "TRL": [{"step": 0, "seconds": 0.0, "accuracy": 0.8}, {"step": 10, "seconds": 7.0, "accuracy": 0.85}]}
    reached = {side: time_to_quality.time_to_threshold(curve, 0.9) for side, curve in curves.items()}
    time_to_quality.plot_curves(curves, 0.9, reached, "t", tmp_path / "ttq.png")

    points = [{"value": v, "step_s": 0.1 * v, "phases_s": {p: 0.02 * v for p in bench_scaling.PHASES}} for v in (2, 4, 8)]
    results = {"G": points}
    bench_scaling.plot_axes(results, {"G": bench_scaling.axis_summary("G", points, 0.15)}, tmp_path / "scaling.png")

    rows = [bench_rollout.sweep_row(axis, dtype, b, n, [100.0 * b], [120.0 * b])
            for dtype, _ in bench_rollout.DTYPES for axis, b, n in bench_rollout.sweep_points([1, 4], 8, [4, 8], 2)]
    assert rows[0]["ratio"] == pytest.approx(1.2)
    bench_rollout.plot_sweep(rows, tmp_path / "sweep.png")
    for name in ("ttq.png", "scaling.png", "sweep.png"):
        assert (tmp_path / name).stat().st_size > 1000


# ----------------------------------------------------------------------------- profile_decode


def test_decode_profile_counts_ops_and_matmuls_of_a_cached_step():
    import profile_decode
    from minirl.config import load_config
    from minirl.runtime import build_model

    model, _ = build_model(load_config(None, ["model.preset=qwen3-moe-tiny"]))
    model.eval()
    row = profile_decode.decode_step_profile(model, batch=2, prompt=4, steps=2)
    assert row["batch"] == 2 and row["step_ms"] > 0 and row["ops_per_step"] > 50
    assert 0 < row["matmul_ms"] < row["aten_ms"]
    fast = profile_decode.decode_step_profile(model, batch=2, prompt=4, steps=2, path="fast")
    assert fast["path"] == "fast" and 0 < fast["matmul_ms"] < fast["aten_ms"]
    assert 20 < fast["ops_per_step"] < row["ops_per_step"]


# ----------------------------------------------------------------------------- compare_trl


def test_compare_trl_overrides_after_sizes_are_overrides():
    args = compare_trl.parse_args(["--sizes", "qwen3-moe-2m", "rollout.precision=fp32", "optim.micro_batch_max_tokens=512"])
    assert args.sizes == ["qwen3-moe-2m"]
    assert args.overrides == ["rollout.precision=fp32", "optim.micro_batch_max_tokens=512"]
    args = compare_trl.parse_args(["moe.routing_metrics=false", "--modes", "natural"])
    assert args.sizes == ["qwen3-moe-2m", "qwen3-moe-20m"] and args.overrides == ["moe.routing_metrics=false"]


def test_compare_trl_unknown_size_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        compare_trl.parse_args(["--sizes", "qwen3-moe-7m"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--sizes: qwen3-moe-7m; presets:" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- bench_micro_batches


@pytest.mark.parametrize("lengths", ["uniform", "full"])
def test_bench_micro_batches_builds_the_demo_shaped_batch(lengths):
    from minirl.config import load_config
    from minirl.runtime import build_model, build_task

    cfg = load_config(str(BENCHMARKS.parent / "configs" / "demo.yaml"), ["cold_start.enabled=false", "model.preset=qwen3-moe-tiny"])
    model, tokenizer = build_model(cfg)
    batch = bench_micro_batches.make_batch(cfg, tokenizer, build_task(cfg, model, tokenizer), lengths)
    assert batch.size == cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    responses = batch.mask.sum(dim=1)
    assert int(responses.min()) >= 1 and int(responses.max()) <= cfg.rollout.max_new_tokens
    assert (responses == cfg.rollout.max_new_tokens).all() == (lengths == "full")


# ----------------------------------------------------------------------------- bench_shared_prompt


@pytest.mark.parametrize("natural", [False, True])
def test_bench_shared_prompt_counts_each_arms_forward_tokens(natural):
    """2 prompts of 5 tokens x 3 samples of 4 (or 1-4) completion tokens: the padded forward computes rows x width,
    padding-free the real tokens, shared prompts each prompt once."""
    batch = bench_shared_prompt.make_batch(2, 3, 5, 4, natural, vocab=30)
    real = int(batch.attention_mask.sum())
    completions = int(batch.mask.sum())
    assert batch.size == 6 and bench_shared_prompt.forward_tokens(batch, "padded") == 6 * batch.input_ids.shape[1]
    assert bench_shared_prompt.forward_tokens(batch, "padding_free") == real == 6 * 5 + completions
    assert bench_shared_prompt.forward_tokens(batch, "shared_prompt") == 2 * 5 + completions
    assert (batch.mask.sum(dim=1) == 4).all() != natural


# ----------------------------------------------------------------------------- lean_forward (bench_update_bound's probe)


@pytest.mark.parametrize("family", ["moe", "dense"])
def test_the_lean_forward_probe_is_bitwise_the_transformers_forward(family, one_thread):
    """The probe measures only what the module stack costs if it computes the same thing: the
    log-probs, the loss and every parameter's gradient, bit for bit."""
    from minirl.algo import token_logprobs
    from tests.conftest import make_tiny_moe
    from tests.unit.test_rollout_native import dense_model

    model = make_tiny_moe(seed=1) if family == "moe" else dense_model(seed=1)
    model.train()
    ids = torch.randint(2, 48, (5, 11), generator=torch.Generator().manual_seed(0))

    def grads_of(forward):
        model.zero_grad(set_to_none=True)
        logp = token_logprobs(forward(ids)[:, :-1].float(), ids[:, 1:])
        loss = (logp * torch.linspace(-1, 1, ids.shape[0])[:, None]).sum()
        loss.backward()
        return logp.detach(), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    logp_a, loss_a, grads_a = grads_of(lambda x: model(input_ids=x, use_cache=False).logits)
    logp_b, loss_b, grads_b = grads_of(lean_forward.LeanForward(model))
    assert torch.equal(logp_a, logp_b) and torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in grads_a.items():
        assert torch.equal(grad, grads_b[name]), name


# ----------------------------------------------------------------------------- gpu_bench's host-sync census


def test_host_sync_census_counts_torchs_sync_warnings_by_line(monkeypatch):
    """CUDA's sync debug mode warns "called a synchronizing CUDA operation" at each sync; the census
    counts those by the line that made them and ignores other warnings (CPU: the mode is stubbed)."""
    import warnings

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def work():
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # one line, three times
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        warnings.warn("something else entirely", stacklevel=1)

    census = gpu_bench.host_sync_census(work)
    assert census["total"] == 4 and sorted(census["by_site"].values()) == [1, 3]
    assert all(site.startswith("test_benchmark_scripts.py:") for site in census["by_site"])
    assert modes == ["warn", "default"]


def test_step_profile_charges_each_operator_to_its_phase_and_kind():
    from torch.profiler import profile, record_function

    a, q = torch.randn(32, 32), torch.randn(1, 2, 8, 16)
    with profile() as prof:
        with record_function("phase:rollout"):
            torch.mm(a, a)
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        with record_function("phase:update"):
            (a * 2).sum()
        torch.mm(a, a)  # outside both: rewards, batching, the sync
    table = profile_step.charge(prof.events())
    assert table["rollout"]["gemm"] > 0 and table["rollout"]["attention"] > 0
    assert table["update"]["gemm"] == 0 and table["update"]["attention"] == 0 and table["update"]["other ops"] > 0
    assert table["other"]["gemm"] > 0 and table["other"]["attention"] == 0
    assert table["rollout"]["wall"] >= table["rollout"]["gemm"] + table["rollout"]["attention"]


def test_step_profile_phases_wrap_the_engine_and_the_trainer_and_unwrap_them():
    from types import SimpleNamespace

    class Engine:
        def generate_ids(self, x):
            return x + 1

    class Trainer:
        def update(self, x):
            return x * 2

    run = SimpleNamespace(engine=Engine(), trainer=Trainer())
    run.trainer.update = lambda x: x * 3  # an instance's own attribute: wrapped, then given back
    with profile_step.phases(run):
        assert "generate_ids" in vars(run.engine) and run.engine.generate_ids(1) == 2 and run.trainer.update(3) == 9
    assert "generate_ids" not in vars(run.engine) and run.trainer.update(3) == 9
    assert run.engine.generate_ids(1) == 2
