"""End to end: the CLI on a tiny model (SFT cold start, MiniRL steps, eval, checkpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

TINY = [
    "model.preset=qwen3-moe-tiny", "task.kind=reverse", "task.difficulty=3", "task.num_train_prompts=64",
    "task.num_eval_prompts=8", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=12",
    "optim.global_steps=3", "optim.micro_batch_sequences=4", "eval.num_prompts=4", "eval.samples_per_prompt=2",
    "eval.every_steps=2", "cold_start.steps=5", "cold_start.examples=32", "cold_start.batch_sequences=8",
    "run.threads=1",
]


def _minirl(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minirl.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("replay, minibatches, extra", [
    ("none", 1, []), ("R2", 2, ["optim.padding_free=true"]),  # R2 records and replays on packed rows
    # dynamic micro-batches (~2 rows of ~17 tokens each), each prompt once in a micro-batch (R3's prompt routes alike)
    ("R3", 2, ["optim.micro_batch_max_tokens=40", "optim.shared_prompt=true"]),
])
def test_train_with_cold_start_writes_a_complete_run(tmp_path, replay, minibatches, extra):
    proc = _minirl(
        "train", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "run.name=e2e", "cold_start.enabled=true",
        f"moe.routing_replay={replay}", f"optim.minibatches_per_step={minibatches}", "rollout.precision=bf16",
        "diagnostics.every_steps=2", *extra,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out accuracy (reward >= 1) before RL" in proc.stderr and "run dir" in proc.stderr
    run = tmp_path / "e2e"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in ("train/reward_mean", "train/entropy", "mismatch/kl_k1", "mismatch/kl_k3", "policy/clip_frac",
                "policy/is_weight_mean", "optim/grad_norm", "optim/lr", "time/rollout_s", "time/update_s",
                "perf/rollout_tokens_per_s"):
        assert key in rows[1], key
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]
    assert rows[1]["mismatch/abs_dlogp_mean"] > 0  # bf16 engine vs fp32 trainer
    for key in ("fidelity/first_grad_cosine", "fidelity/last_grad_cosine", "residual/first_total_mean",
                "residual/last_staleness_mean", "is/first_ess_seq", "is/last_chi2_token"):
        assert key in rows[2] and key not in rows[1], key
    assert rows[2]["residual/first_staleness_mean"] == 0.0  # theta == theta_old before the first update
    assert (run / "config.yaml").is_file()
    import torch

    (env,) = [json.loads(line) for line in (run / "environment.jsonl").read_text().splitlines()]
    assert env["from_step"] == 0 and env["torch"] == torch.__version__ and env["transformers"] and env["cpu"] and env["cpu_capability"]
    assert env["cpu_native_half_gemm"] is bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoint")
    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint")
    assert model.config.model_type == "qwen3_moe" and tokenizer.eos_token_id is not None


def test_sft_then_train_from_checkpoint_then_eval(tmp_path):
    sft = _minirl("sft", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "run.name=s", "--output", str(tmp_path / "ckpt"))
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert (tmp_path / "ckpt" / "config.json").is_file()
    train = _minirl("train", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "run.name=t",
                    f"model.path={tmp_path / 'ckpt'}", "cold_start.enabled=false", "optim.global_steps=1")
    assert train.returncode == 0, train.stderr[-3000:]
    # greedy evaluation (verl's validation default), twice: no draw, so the same result
    greedy = [_minirl("eval", str(where), *TINY, "eval.temperature=0", "eval.samples_per_prompt=1", f"run.seed={seed}")
              for seed, where in ((0, tmp_path / "t" / "checkpoint"), (1, tmp_path / "t"))]  # the run directory too
    assert all(ev.returncode == 0 for ev in greedy), greedy[0].stderr[-3000:]
    results = [json.loads(ev.stdout.strip().splitlines()[-1]) for ev in greedy]
    assert 0.0 <= results[0]["eval/accuracy"] <= 1.0 and results[0] == results[1]
    # without --config: the config of the run that wrote the checkpoint, said in one line
    assert f"minirl eval: the run's config {tmp_path / 't' / 'config.yaml'}" in greedy[0].stderr
    assert f"minirl eval: the run's final model {tmp_path / 't' / 'checkpoint'}" in greedy[1].stderr
    assert results[0]["task"] == "reverse"
    # from another directory: evaluated in the run's own (its config names configs/... relative to it), said
    elsewhere = subprocess.run([sys.executable, "-m", "minirl.cli", "eval", str(tmp_path / "t" / "checkpoint"), *TINY,
                                "eval.temperature=0", "eval.samples_per_prompt=1"], capture_output=True, text=True,
                               timeout=300, cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert f"minirl eval: in the run's working directory {ROOT}" in elsewhere.stderr
    assert json.loads(elsewhere.stdout.strip().splitlines()[-1])["eval/accuracy"] == results[0]["eval/accuracy"]


def test_dense_model_with_replay_is_a_config_error(tmp_path):
    proc = _minirl("train", "configs/demo.yaml", *TINY, "model.preset=qwen3-dense-2m", "moe.routing_replay=R2",
                   f"run.output_dir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "moe.routing_replay" in proc.stderr and "dense" in proc.stderr


def test_help_of_every_command():
    for command in ("train", "sft", "eval"):
        proc = _minirl(command, "--help", timeout=60)
        assert proc.returncode == 0 and "key=value" in proc.stdout


def test_dense_model_trains_without_routing_metrics(tmp_path):
    proc = _minirl("train", "configs/demo.yaml", *TINY, "model.preset=qwen3-dense-2m", "optim.global_steps=2",
                   f"run.output_dir={tmp_path}", "run.name=dense", "cold_start.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "dense" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert 0.0 <= rows[0]["eval/accuracy"] <= rows[0]["eval/pass@2"] <= 1.0  # 2 samples per held-out prompt
    assert rows[2]["mismatch/abs_dlogp_mean"] > 0  # the fp8 engine of the demo config
    assert not any(key.startswith("routing/") for key in rows[2])


def test_an_fp32_engine_at_a_temperature_below_one_shows_no_mismatch(tmp_path):
    """The trainer scores at the rollout temperature (``optim.score_at_rollout_temperature``): with an fp32 engine
    sampling at T = 0.7, pi_old equals mu_old to float rounding; scored at T = 1 (the switch off) the gap is the
    temperature's (measured: mismatch/kl_k3 ~5e-3 on this config)."""
    common = ("train", "configs/demo.yaml", *TINY, "optim.global_steps=1", f"run.output_dir={tmp_path}", "eval.every_steps=0",
              "cold_start.enabled=false", "rollout.precision=fp32", "rollout.kv_cache_precision=same", "rollout.temperature=0.7")
    gaps = {}
    for switch in ("true", "false"):
        proc = _minirl(*common, f"run.name=tempered_{switch}", f"optim.score_at_rollout_temperature={switch}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / f"tempered_{switch}" / "metrics.jsonl").read_text().splitlines()]
        gaps[switch] = next(r for r in rows if "mismatch/abs_dlogp_max" in r)["mismatch/abs_dlogp_max"]
    assert gaps["true"] < 1e-5 and gaps["false"] > 1e-2, gaps


@pytest.mark.slow  # the default suite's 15-minute budget; the cache's keys are unit-tested
def test_cold_start_cache_reuses_one_sft_per_key(tmp_path):
    from safetensors.torch import load_file

    from minirl.config import load_config
    from minirl.sft import sft_cache_key

    cache = tmp_path / "sft_cache"
    common = ("train", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "cold_start.enabled=true",
              f"cold_start.cache_dir={cache}", "optim.global_steps=1", "rollout.precision=bf16")
    first = _minirl(*common, "run.name=a")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "sft step" in first.stderr and "reusing" not in first.stderr
    second = _minirl(*common, "run.name=b", "algo.clip=false", "moe.routing_replay=R2")  # RL knobs: same SFT
    assert second.returncode == 0, second.stderr[-3000:]
    assert "reusing SFT checkpoint" in second.stderr and "sft step" not in second.stderr
    third = _minirl(*common, "run.name=c", "run.seed=1")  # another seed: another SFT
    assert third.returncode == 0, third.stderr[-3000:]
    assert "sft step" in third.stderr
    fourth = _minirl(*common, "run.name=d", "run.seed=1", "cold_start.seed=0")  # pinned SFT seed: seed 0's SFT
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "reusing SFT checkpoint" in fourth.stderr
    keys = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert len(keys) == 2 and not list(cache.glob(".*tmp*"))
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, "cold_start.enabled=true", f"cold_start.cache_dir={cache}"])
    assert sft_cache_key(cfg) in keys
    # the cached weights are what a plain cold start makes
    plain = _minirl("sft", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "run.name=p",
                    "--output", str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr[-3000:]
    cached, fresh = load_file(cache / sft_cache_key(cfg) / "model.safetensors"), load_file(tmp_path / "plain" / "model.safetensors")
    assert cached.keys() == fresh.keys() and all(torch.equal(cached[k], fresh[k]) for k in cached)


def test_a_reward_model_beside_a_reward_function_trains(tmp_path):
    """TRL's ``reward_funcs=[model, function]``: a sequence-classification reward model's score, weighted beside a
    verifiable reward, drives the run; each is logged by its name."""
    import torch
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from minirl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen3ForSequenceClassification(config).save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    entries = f'[{{model: "{tmp_path / "judge"}", weight: 0.5}}, {{function: "minirl.tasks.jsonl:exact_reward"}}]'
    proc = _minirl("train", "configs/demo.yaml", *TINY, f"run.output_dir={tmp_path}", "run.name=rm", "optim.global_steps=1",
                   "cold_start.enabled=false", f"task.reward_functions={entries}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert "reward/judge/mean" in rows[-1] and "reward/exact_reward/mean" in rows[-1]
    assert rows[-1]["reward/errors"] == 0.0


def test_a_users_llama4_model_directory_trains_with_r3(tmp_path):
    """A Llama-4 text MoE (dense router scores, every expert on every token) saved as a Hugging Face directory trains
    from it with R3: the engine records its routes, the trainer replays them, and with an fp32 engine pi_old equals
    mu_old to float rounding; the routing metrics report the replayed routes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from minirl.models import load_model_and_tokenizer
    from minirl.models.io import save_checkpoint

    _, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny")
    config = AutoConfig.for_model(
        "llama4_text", vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    save_checkpoint(AutoModelForCausalLM.from_config(config), tokenizer, tmp_path / "llama4")
    proc = _minirl("train", "configs/demo.yaml", *TINY, f"model.path={tmp_path / 'llama4'}", "optim.global_steps=2",
                   "moe.routing_replay=R3", "optim.minibatches_per_step=2", "rollout.precision=fp32",
                   "rollout.kv_cache_precision=same", f"run.output_dir={tmp_path}", "run.name=llama4",
                   "cold_start.enabled=false", "eval.every_steps=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "llama4" / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["step"] == 2 and last["mismatch/abs_dlogp_max"] < 1e-4
    assert last["routing/train_infer_diff_frac"] == 0.0  # an fp32 engine picks the trainer's experts
    assert {"routing/train_infer_diff_frac_layer0", "routing/train_infer_diff_frac_layer1"} <= set(last)
