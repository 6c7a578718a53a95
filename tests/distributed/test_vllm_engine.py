"""The vLLM rollout backend. Tests marked ``vllm`` need an importable vLLM (a CUDA machine with
``pip install 'minirl[vllm]'``) and are reported as skipped elsewhere; the rest check, everywhere,
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


# ----------------------------------------------------------------------------- with vLLM (GPU)


def _engine(model, tokenizer, tmp_path, **kwargs):
    from minirl.models.io import save_checkpoint
    from minirl.rollout.vllm_engine import VLLMEngine

    save_checkpoint(model, tokenizer, tmp_path / "model")
    with torch.device("meta"):
        skeleton = type(model)(model.config)
    return VLLMEngine(str(tmp_path / "model"), skeleton, tokenizer, max_model_len=128, gpu_memory_utilization=0.3, **kwargs)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not importable here (pip install 'minirl[vllm]' on a CUDA machine)")
def test_vllm_samples_logprobs_routes_and_takes_new_weights(tmp_path):
    from minirl.models.io import load_model_and_tokenizer
    from minirl.types import Prompt, SamplingParams

    model, tokenizer = load_model_and_tokenizer("qwen3-moe-tiny", seed=0)
    engine = _engine(model, tokenizer, tmp_path, precision="fp32", record_routes=True)
    prompts = [Prompt(text="abc", answer=""), Prompt(text="hello", answer="")]
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    whole = engine.generate(prompts, 3, sampling, record_routes=True)
    assert len(whole) == 6 and all(c.routes.shape[0] == len(c.prompt_ids) + len(c.completion_ids) for c in whole)
    # the engine's log-probs are those of the trainer (fp32, temperature 1, no top-p)
    from minirl.batching import collate
    from minirl.trainer import Trainer

    batch = collate(whole, torch.zeros(6), pad_token_id=tokenizer.pad_token_id)
    logp_old = Trainer(model, lr=0.0).score(batch).logp
    assert float(((logp_old - batch.logp_rollout) * batch.mask).abs().max()) < 1e-3
    # split invariance: the second prompt alone, told its position, samples the same
    tail = engine.generate(prompts[1:], 3, sampling, record_routes=True, prompt_offset=1)
    assert [c.completion_ids for c in tail] == [c.completion_ids for c in whole[3:]]
    # new weights without a restart change what is sampled
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    engine.load_weights(model.state_dict())
    after = engine.generate(prompts, 3, sampling)
    assert [c.completion_ids for c in after] != [c.completion_ids for c in whole]
