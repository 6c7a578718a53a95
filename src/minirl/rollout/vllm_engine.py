"""``VLLMEngine``: the ``RolloutEngine`` protocol on vLLM (``cluster.engine_backend: vllm``).

Optional: ``pip install 'minirl[vllm]'`` on a CUDA machine. Where vLLM cannot be imported, a
config selecting it stops with one line (``minirl.distributed.placement.require_vllm``).

What minirl needs from the engine, and how vLLM gives it:

* ``logp_rollout`` of the distribution actually sampled from: ``LLM(logprobs_mode=
  "processed_logprobs")`` (log-probs after temperature and top-p, not of the raw logits) and
  ``SamplingParams(logprobs=0)`` (the sampled token's log-prob only).
* Routes for R3: ``LLM(enable_return_routed_experts=True)`` (vLLM's routed-experts return; it needs
  prefix caching, on by default). Each ``CompletionOutput.routed_experts`` is ``[gen_len, L, K]``;
  the prompt's rows come as ``RequestOutput.prompt_routed_experts`` ``[prompt_len, L, K]`` where
  the vLLM version reports them separately. They are laid out as minirl's ``[S, L, K]`` (prompt then
  completion positions), the last sampled token's row -1 (never fed).
* Weights from the trainer without a restart: the trainer's state dict is converted back to the
  checkpoint layout the model's vLLM ``load_weights`` reads (``transformers``'
  ``revert_weight_conversion``: fused expert tensors split per expert), loaded in place through
  ``LLM.apply_model`` and the prefix cache reset (cached KV blocks were computed by old weights).
  ``apply_model`` ships a closure to the workers, so ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` is set.
  On many GPUs, vLLM's NCCL weight-transfer API is the faster route (``docs/distributed.md``).
* Split-invariant sampling: every response is its own request with its own seed, keyed by (step
  seed, prompt position in the step, sample index), as the native engine's ``per_sample`` seeding;
  so E engines sample what one engine would, whatever ``cluster.sample_seeding`` says.

``rollout.precision`` maps to vLLM's own numerics: fp32/bf16/fp16 -> ``dtype``, fp8_e4m3 ->
``quantization="fp8"`` (dynamic per-tensor FP8 weights over bf16, the paper's FP8 rollout);
``rollout.kv_cache_precision`` fp8_* -> ``kv_cache_dtype``. Formats vLLM has no switch for are a
``ConfigError``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

import torch

from minirl.config import Config, ConfigError
from minirl.types import Completion, Prompt, SamplingParams

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8_e4m3": "bfloat16"}


def request_seed(seed: int, prompt: int, sample: int) -> int:
    """The seed of one response's request: (step seed, prompt position, sample index), 63 bits."""
    key = hashlib.blake2b(f"{seed}:{prompt}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(key, "little") >> 1


def layout_routes(prompt_routes: Any, completion_routes: Any, prompt_len: int, completion_len: int) -> torch.Tensor:
    """minirl's ``[prompt_len + completion_len, L, K]`` int16 routes from vLLM's arrays.

    ``completion_routes`` ``[n, L, K]`` are the generated positions, or all positions when
    ``prompt_routes`` is None (vLLM versions that return one array per response). Rows past what
    vLLM reported, and the last sampled token's row (never fed), are -1: natural routing on replay.
    """
    if completion_routes is None:
        raise RuntimeError(
            "vLLM returned no routed experts: the engine must be started with enable_return_routed_experts=True "
            "(a vLLM with routed-experts return, Model Runner V2, prefix caching on)"
        )
    parts = [torch.as_tensor(completion_routes)]
    if prompt_routes is not None:
        parts.insert(0, torch.as_tensor(prompt_routes))
    reported = torch.cat([p.to(torch.int16).reshape(p.shape[0], *p.shape[-2:]) for p in parts])
    total = prompt_len + completion_len
    routes = torch.full((total, *reported.shape[1:]), -1, dtype=torch.int16)
    fed = min(total - 1, reported.shape[0])
    routes[:fed] = reported[:fed]
    return routes


class VLLMEngine:
    """Samples with a ``vllm.LLM`` built from an HF directory; see the module docstring."""

    def __init__(
        self,
        model_dir: str,
        hf_model: torch.nn.Module,
        tokenizer: Any,
        *,
        precision: str = "bf16",
        kv_cache_precision: str = "same",
        max_model_len: int | None = None,
        seed: int = 0,
        record_routes: bool = False,
        gpu_memory_utilization: float = 0.85,
    ) -> None:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships a closure
        from vllm import LLM

        self.tokenizer = tokenizer
        self.hf_model = hf_model  # for the checkpoint layout of incoming state dicts (meta tensors)
        self.eos_ids = [tokenizer.eos_token_id] if isinstance(tokenizer.eos_token_id, int) else list(tokenizer.eos_token_id)
        kwargs: dict[str, Any] = {
            "model": model_dir,
            "tokenizer": model_dir,
            "dtype": DTYPES[precision],
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": True,
        }
        if precision == "fp8_e4m3":
            kwargs["quantization"] = "fp8"
        if kv_cache_precision != "same":
            kwargs["kv_cache_dtype"] = kv_cache_precision
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if record_routes:
            kwargs["enable_return_routed_experts"] = True
        self.records_routes = record_routes
        self.llm = LLM(**kwargs)

    @classmethod
    def from_config(cls, cfg: Config, model: torch.nn.Module, tokenizer: Any, source: str | None) -> "VLLMEngine":
        """An engine for the run: a preset is first written as an HF directory vLLM can load."""
        from minirl.models.io import is_moe, save_checkpoint

        r = cfg.rollout
        if r.precision not in DTYPES:
            raise ConfigError(f"rollout.precision: {r.precision} has no vLLM switch; use fp32, bf16, fp16 or fp8_e4m3 with engine_backend=vllm")
        if r.kv_cache_precision not in ("same", "fp8_e4m3", "fp8_e5m2"):
            raise ConfigError(f"rollout.kv_cache_precision: {r.kv_cache_precision} has no vLLM switch")
        model_dir = source if source and os.path.isdir(source) else None
        if model_dir is None:
            model_dir = tempfile.mkdtemp(prefix="minirl-vllm-")
            save_checkpoint(model, tokenizer, model_dir)
        routes = is_moe(model) and (cfg.moe.routing_replay == "R3" or cfg.moe.routing_metrics)
        context = getattr(model.config, "max_position_embeddings", None)
        with torch.device("meta"):  # only the class and config matter for the checkpoint layout
            skeleton = type(model)(model.config)
        colocated = cfg.cluster.backend == "local" and cfg.cluster.device == "cuda"  # the trainer shares the GPU
        return cls(
            model_dir, skeleton, tokenizer, precision=r.precision, kv_cache_precision=r.kv_cache_precision,
            max_model_len=context, seed=cfg.run.seed, record_routes=routes, gpu_memory_utilization=0.35 if colocated else 0.85,
        )

    # ---------------------------------------------------------------- RolloutEngine

    def generate(
        self, prompts: list[Prompt], samples_per_prompt: int, sampling: SamplingParams, record_routes: bool = False,
        prompt_offset: int = 0,
    ) -> list[Completion]:
        from vllm import SamplingParams as VLLMSampling

        if record_routes and not self.records_routes:
            raise ValueError("record_routes=True needs an engine started with enable_return_routed_experts (an MoE model)")
        prompt_ids = [list(self.tokenizer.encode(p.text, add_special_tokens=False)) for p in prompts]
        requests, params = [], []
        for index, ids in enumerate(prompt_ids):
            for sample in range(samples_per_prompt):
                requests.append({"prompt_token_ids": ids})
                params.append(VLLMSampling(
                    n=1, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_new_tokens,
                    seed=request_seed(int(sampling.seed), prompt_offset + index, sample), logprobs=0,
                    stop_token_ids=self.eos_ids, skip_special_tokens=True,
                ))
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        completions = []
        for row, output in enumerate(outputs):
            prompt_index, sample_index = divmod(row, samples_per_prompt)
            result = output.outputs[0]
            tokens = list(result.token_ids)
            logp = torch.tensor([step[token].logprob for token, step in zip(tokens, result.logprobs)], dtype=torch.float32)
            routes = None
            if record_routes:
                routes = layout_routes(getattr(output, "prompt_routed_experts", None), getattr(result, "routed_experts", None),
                                       len(prompt_ids[prompt_index]), len(tokens))
            completions.append(Completion(
                prompt_index=prompt_index, sample_index=sample_index, prompt_ids=prompt_ids[prompt_index],
                completion_ids=tokens, logp_rollout=logp,
                finish_reason="eos" if tokens and tokens[-1] in self.eos_ids else "length",
                text=result.text, routes=routes,
            ))
        return completions

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The trainer's weights into the running engine (no restart), then a fresh prefix cache."""
        from transformers.core_model_loading import revert_weight_conversion

        weights = list(revert_weight_conversion(self.hf_model, dict(state_dict)).items())
        self.llm.apply_model(lambda model: model.load_weights(weights))
        self.llm.reset_prefix_cache()
