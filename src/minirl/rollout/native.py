"""``NativeEngine``: minirl's built-in rollout engine, a batched KV-cache sampler over a HF model.

It keeps its own copy of the policy's weights in a configurable precision (``precision.py``), so
that on CPU the engine can differ from the fp32 trainer the way an FP8 or bf16 inference engine
differs from its trainer on GPUs (``rollout.kv_cache_precision`` can add an fp8 KV cache,
``kv_cache.py``). It reports, for each sampled token, the log-probability under
the distribution it actually sampled from (``logp_rollout``, mu_old) and, on request, the top-k
experts each MoE layer chose for each fed token (``routes``, for R3).

The loop, in one sentence per step:
    left-pad the prompts (prefill each distinct prompt once, then repeat its cache G times);
    positions are ``cumsum(mask) - 1`` so a padded row computes what the unpadded prompt would;
    each decode step feeds the last sampled token of every still-running row, with the cache
    (for the families of ``fast_decode.FAMILIES``: a pre-allocated cache and far fewer operators than the
    transformers forward, bitwise the same logits);
    rows that sampled EOS (or any of the EOS ids) leave the batch; the rest run to
    ``max_new_tokens`` (finish reason ``"length"``). The EOS token is part of the completion and
    has a log-prob; the last sampled token of every row is never fed, so its route row is -1.

Tool rounds (``keeping_prefixes``): inside it, each row that ends keeps its KV cache and routes, and a later call
whose prompt begins with a kept row's tokens feeds only the rest (the token sampled last and a tool's result): the
conversation is not prefilled again, and each position keeps the route recorded when the engine first fed it.

Randomness: one ``torch.Generator`` per seed value. The first call with ``sampling.seed = s``
seeds it with ``s``; later calls with the same seed continue that stream. So a loop that passes
a new seed each step (``minirl.loop`` does) gets samples that depend only on that step's seed,
and a loop passing the same seed every step does not repeat its samples; an evaluation call
with its own seed in between disturbs neither. The ``MAX_STREAMS`` most recently used streams
are kept. ``get_rng_state``/``set_rng_state`` checkpoint them.

With ``sample_seeding="per_sample"`` every response instead draws from its own stream, seeded by
(``sampling.seed``, the prompt's position in the step, the sample index), where the position is
``prompt_offset`` + the prompt's index in the call. A response then does not depend on which other
prompts share its batch, so prompts split across several engines (``minirl.distributed``) sample
exactly what one engine would; a repeated seed repeats its samples, and there is no state to save.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from minirl.rollout.base import DecodeControl
from minirl.rollout.fast_decode import (
    HALF_GEMM,
    HYBRID_FAMILIES,
    LATENT_FAMILIES,
    FastDecoder,
    StaticKVCache,
    native_half_gemm,
    unsupported_reason,
)
from minirl.rollout.kv_cache import OWN_CACHES, check_cache_precision, new_cache, repeat_rows, select_rows
from minirl.rollout.precision import (
    DEFAULT_FP4_BLOCK_SIZE,
    KV_CACHE_PRECISIONS,
    WEIGHT_ONLY,
    KVCachePrecision,
    Precision,
    ScaleMode,
    apply_precision,
    compute_dtype_of,
    fake_quantize,
    quantized_input_dims,
)
from minirl.rollout.sampling import Draw, validate_sampling
from minirl.rollout.stop_strings import StopStrings
from minirl.tasks.chat import cut_at_stop_strings, encode_prompt
from minirl.types import Completion, Prompt, SamplingParams

MAX_STREAMS = 8  # sampling streams (one per seed value) kept, least recently used dropped first


class NativeEngine:
    """Batched sampling with a KV cache over a Hugging Face causal LM, in a chosen precision.

    Args:
        model: the trainer's model (a ``transformers`` causal LM). The engine keeps its own deep
            copy (without hooks or gradients); the trainer's module is never touched again.
        eos_token_id: id (or ids) that end a completion.
        pad_token_id: id used for left padding (never attended to).
        precision: ``"fp32" | "bf16" | "fp16" | "fp8_e4m3" | "fp8_e5m2" | "fp4_e2m1"``, see
            ``minirl.rollout.precision``.
        fp8_scale: ``"per_tensor" | "per_expert"`` (fp8 only).
        fp4_block_size: values per shared scale along a weight's input dimension (fp4 only);
            must divide every quantised weight's input dimension (``ValueError`` otherwise).
        kv_cache_precision: ``"same"`` (the compute dtype, today's cache exactly) or
            ``"fp8_e4m3" | "fp8_e5m2"``: keys and values rounded to fp8 with one scale per token
            and KV head when written (``minirl.rollout.kv_cache``).
        compute_dtype: activation dtype for the weight-only formats (``"fp32"`` default, or ``"bf16"``).
        tokenizer: needed only by ``generate`` (text prompts) and for ``Completion.text``.
        stop_strings: ``generate`` ends a completion after the first token that completes one
            (``minirl.tasks.chat.cut_at_stop_strings``; the kept tokens' log-probs are exact).
        device: where the engine's copy lives.
        sample_seeding: ``"per_batch"`` (one stream per seed) or ``"per_sample"`` (one per response,
            independent of the batch; see the module docstring).
        decode_path: ``"auto"`` (decode steps through ``minirl.rollout.fast_decode`` where it supports
            the model, bitwise the same logits with far fewer operators; the transformers forward
            otherwise), ``"transformers"`` (always the model's own forward) or ``"static"`` (the fast
            step over a static cache by batch-size bucket, ``minirl.rollout.graph_decode``; eager).
        cuda_graphs: on a CUDA device, decode with ``graph_decode`` and capture each bucket's step in
            a CUDA graph (needs a model ``fast_decode`` supports); no effect on a CPU.
        half_gemm: how the fast decode path runs bf16 / fp16 matmuls: ``"native"`` (torch's kernels,
            bitwise the transformers forward), ``"fp32"`` (fp32 GEMMs on the same half-precision
            values, rounded once: ~10x faster matmuls on CPUs without native bf16, the same
            products, another summation order; ``minirl.rollout.fast_decode``) or ``"auto"``
            (``"fp32"`` on a CPU without AVX512-BF16 / AMX, else ``"native"``). No effect in fp32.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        precision: Precision = "fp32",
        fp8_scale: ScaleMode = "per_tensor",
        fp4_block_size: int = DEFAULT_FP4_BLOCK_SIZE,
        kv_cache_precision: KVCachePrecision = "same",
        compute_dtype: str | None = None,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
        sample_seeding: str = "per_batch",
        decode_path: str = "auto",
        half_gemm: str = "auto",
        stop_strings: Sequence[str] = (),
        cuda_graphs: bool = False,
    ) -> None:
        # Over 60 lines: every engine knob is validated and stored here once, with its reason beside it.
        if eos_token_id is None or pad_token_id is None:
            raise ValueError(f"NativeEngine needs eos and pad token ids (got {eos_token_id=}, {pad_token_id=})")
        eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if not eos_ids:
            raise ValueError("eos_token_id must name at least one token id")
        if kv_cache_precision not in KV_CACHE_PRECISIONS:
            raise ValueError(f"unknown kv_cache_precision {kv_cache_precision!r}; expected one of {KV_CACHE_PRECISIONS}")
        self.precision = precision
        self.fp8_scale = fp8_scale
        self.fp4_block_size = fp4_block_size
        self.kv_cache_precision = kv_cache_precision
        check_cache_precision(model.config, kv_cache_precision)  # before the weights are copied
        self.compute_dtype = compute_dtype_of(precision, compute_dtype)
        if sample_seeding not in ("per_batch", "per_sample"):
            raise ValueError(f"sample_seeding must be 'per_batch' or 'per_sample' (got {sample_seeding!r})")
        self.sample_seeding = sample_seeding
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self._stop_check: StopStrings | None = None  # built at the first decode that needs it (a vocabulary pass)
        self.device = torch.device(device)
        self.pad_token_id = int(pad_token_id)
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long, device=self.device)

        self.model = _own_copy(model).to(self.device).eval().requires_grad_(False)
        # quantised parameter -> its input dimension (the fp4 block axis); empty unless weight-only
        self._quantized = quantized_input_dims(self.model) if precision in WEIGHT_ONLY else {}
        apply_precision(
            self.model, precision, fp8_scale=fp8_scale, compute_dtype=compute_dtype, fp4_block_size=fp4_block_size
        )
        self._params = list(self.model.named_parameters())
        state_names = set(self.model.state_dict())
        self._persistent_buffers = [(name, b) for name, b in self.model.named_buffers() if name in state_names]
        # transformers 5.24 renamed the forward's `past_key_values` to `cache` (old name deprecated)
        forward_parameters = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_parameters else "past_key_values"
        if decode_path not in ("auto", "transformers", "static"):
            raise ValueError(f"decode_path must be 'auto', 'transformers' or 'static' (got {decode_path!r})")
        self.decode_path = decode_path
        if half_gemm not in ("auto", *HALF_GEMM):
            raise ValueError(f"half_gemm must be 'auto' or one of {HALF_GEMM} (got {half_gemm!r})")
        if half_gemm == "auto":
            half_gemm = "native" if native_half_gemm(self.device) else "fp32"
        self.half_gemm = half_gemm
        self._fast: FastDecoder | None = None
        graphs = cuda_graphs and self.device.type == "cuda"
        if decode_path in ("auto", "static") and unsupported_reason(self.model) is None:
            kv_format = None if kv_cache_precision == "same" else kv_cache_precision
            self._fast = FastDecoder(self.model, kv_cache_format=kv_format, half_gemm=half_gemm)
        elif decode_path == "static" or graphs:
            raise ValueError(f"the static / CUDA-graph decode path does not support this model: {unsupported_reason(self.model)}")
        self._buckets: Any = None  # minirl.rollout.graph_decode.BucketDecoder
        if decode_path == "static" or graphs:
            from minirl.rollout.graph_decode import BucketDecoder

            self._buckets = BucketDecoder(self._fast, graphs=graphs)
        self._generators: OrderedDict[int, torch.Generator] = OrderedDict()
        self._replay: Any = None  # minirl.moe.RoutingReplay over self.model, built on first use
        self._prefixes: list[_Kept] | None = None  # rows kept inside ``keeping_prefixes`` (None: outside)

    # ---------------------------------------------------------------- weights

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy the trainer's weights in (in place, no re-instantiation), re-applying the precision.

        fp8/fp4 parameters are fake-quantised from the incoming (full-precision) tensor, so
        weights are rounded once per load, never twice.
        """
        missing = [name for name, _ in self._params if name not in state_dict]
        if missing:
            raise KeyError(f"load_weights: state dict lacks {len(missing)} parameter(s), e.g. {missing[:3]}")
        if self._prefixes is not None:  # kept caches belong to the old weights
            self._prefixes.clear()
        for name, param in self._params:
            source = state_dict[name]
            if name in self._quantized:
                source = fake_quantize(
                    source.to(param.device),
                    self.precision,
                    fp8_scale=self.fp8_scale,
                    fp4_block_size=self.fp4_block_size,
                    input_dim=self._quantized[name],
                    dtype=param.dtype,
                )
            param.copy_(source)
        for name, buffer in self._persistent_buffers:
            if name in state_dict:
                buffer.copy_(state_dict[name])
        if self._fast is not None:
            self._fast.refresh()

    # ---------------------------------------------------------------- randomness

    def get_rng_state(self) -> dict[int, torch.Tensor]:
        """State of every live sampling stream, keyed by seed, oldest first (for checkpoints)."""
        return {seed: generator.get_state() for seed, generator in self._generators.items()}

    def set_rng_state(self, state: dict[int, torch.Tensor]) -> None:
        """Restore the streams saved by ``get_rng_state`` (streams not in ``state`` are dropped)."""
        self._generators = OrderedDict()
        for seed, generator_state in state.items():
            self._generator(int(seed)).set_state(generator_state)

    def _generator(self, seed: int) -> torch.Generator:
        if seed in self._generators:
            self._generators.move_to_end(seed)
        else:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(seed)
            self._generators[seed] = generator
            if len(self._generators) > MAX_STREAMS:
                self._generators.popitem(last=False)
        return self._generators[seed]

    def _sample_generators(self, seed: int, first_prompt: int, num_prompts: int, group: int) -> list[torch.Generator]:
        """One fresh stream per row (prompt-major), keyed by (seed, prompt position, sample index)."""
        generators = []
        for prompt in range(first_prompt, first_prompt + num_prompts):
            for sample in range(group):
                key = hashlib.blake2b(f"{seed}:{prompt}:{sample}".encode(), digest_size=8).digest()
                generator = torch.Generator(device=self.device)
                generator.manual_seed(int.from_bytes(key, "little") >> 1)
                generators.append(generator)
        return generators

    # ---------------------------------------------------------------- sampling

    continues_in_call = True
    """A partial rollout's step is one call with a ``DecodeControl`` (its KV cache kept from check to check), on the
    dynamic loop and on the static buckets (CUDA graphs) alike."""

    @contextmanager
    def keeping_prefixes(self) -> Iterator[None]:
        """Within it, every row that ends keeps its KV cache (and routes) until the next call, and a prompt of that
        call that begins with a kept row's tokens feeds only the rest: a tool round's results and the token before
        them (``minirl.rollout.tools``: each round is one call), not the whole conversation again. The tokens before
        stay as they were computed, so every sampled token's ``logp_rollout`` and each position's recorded route come
        from one computation (R3 replays routes that produced the log-probs of every turn). A call takes the rows kept
        before it, so no more is held than one call's caches. Nothing is kept outside it, or where
        ``prefix_reuse_reason`` says the cache cannot be cut by rows (the calls then prefill whole, as before)."""
        if self._prefixes is not None or self.prefix_reuse_reason() is not None:
            yield
            return
        self._prefixes = []
        try:
            yield
        finally:
            self._prefixes = None

    def prefix_reuse_reason(self) -> str | None:
        """Why ``keeping_prefixes`` keeps nothing for this engine, or None: the static buckets (CUDA graphs), an fp8
        KV cache, caches not made of full-attention keys and values per token (linear attention, latent attention,
        sliding windows, a model's own cache class)."""
        config: Any = self.model.config
        layer_kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        sliding = getattr(config, "sliding_window", None) is not None and (
            config.model_type == "mixtral" or getattr(config, "use_sliding_window", False))
        reasons = [(self._buckets is not None, "the static decode buckets"),
                   (self.kv_cache_precision != "same", "an fp8 KV cache"),
                   (config.model_type in (*HYBRID_FAMILIES, *LATENT_FAMILIES) or config.model_type in OWN_CACHES
                    or layer_kinds != {"full_attention"} or sliding, f"{config.model_type}'s cache")]
        found = next((why for found, why in reasons if found), None)
        if found is None and any(type(layer) is not DynamicLayer for layer in self._new_cache().layers):
            found = f"{config.model_type}'s cache layers (sliding windows, or states that are not per token)"
        return found

    def generate(
        self,
        prompts: list[Prompt],
        samples_per_prompt: int,
        sampling: SamplingParams,
        record_routes: bool = False,
        prompt_offset: int = 0,
        control: DecodeControl | None = None,
    ) -> list[Completion]:
        """``RolloutEngine.generate``: tokenise each ``Prompt.text`` (and its ``response_prefix``) and call ``generate_ids``."""
        if self.tokenizer is None:
            raise ValueError("NativeEngine.generate needs a tokenizer; pass token ids to generate_ids instead")
        # the one tokenisation of a prompt (chat template, BOS), shared with SFT (minirl.tasks.chat)
        prompt_ids = [encode_prompt(self.tokenizer, prompt) + list(prompt.response_prefix or ()) for prompt in prompts]
        completions = self.generate_ids(prompt_ids, samples_per_prompt, sampling, record_routes, prompt_offset, control)
        return [cut_at_stop_strings(c, self.tokenizer, self.stop_strings) for c in completions]

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        samples_per_prompt: int,
        sampling: SamplingParams,
        record_routes: bool = False,
        prompt_offset: int = 0,
        control: DecodeControl | None = None,
    ) -> list[Completion]:
        """Sample ``samples_per_prompt`` completions of each prompt, grouped by prompt.

        ``sampling.temperature`` 0 is greedy (``logp_rollout`` 0, evaluation only; ``minirl.rollout.sampling``). ``prompt_offset``:
        the position of ``prompt_ids[0]`` among all prompts of the step (``per_sample`` seeding only). ``control``: each
        row's own budget (in place of ``sampling.max_new_tokens``) and an early stop (``DecodeControl``).
        """
        validate_sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.repetition_penalty)
        if control is not None:
            budgets = control.max_new_tokens
            if len(budgets) != len(prompt_ids) * samples_per_prompt or min(budgets, default=0) < 1 \
                    or control.check_every_tokens < 1:
                raise ValueError(f"DecodeControl needs one budget >= 1 per row ({len(prompt_ids) * samples_per_prompt} "
                                 f"rows, got {len(budgets)}) and check_every_tokens >= 1")
            sampling = replace(sampling, max_new_tokens=max(budgets))
        if samples_per_prompt < 1 or sampling.max_new_tokens < 1:
            raise ValueError("samples_per_prompt and sampling.max_new_tokens must be >= 1")
        out = self._decode(
            prompt_ids,
            samples_per_prompt,
            sampling,
            generator=(
                self._generator(int(sampling.seed)) if self.sample_seeding == "per_batch"
                else self._sample_generators(int(sampling.seed), prompt_offset, len(prompt_ids), samples_per_prompt)
            ),
            forced=None,
            record_routes=record_routes,
            control=control,
        )
        return self._completions(prompt_ids, samples_per_prompt, out)

    def score_ids(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], sampling: SamplingParams
    ) -> list[torch.Tensor]:
        """Log-probs (float32, one tensor per row) the engine assigns to given completions.

        Runs the same batched KV-cache path as sampling, feeding the given tokens instead of
        drawing them, under the law ``sampling`` describes (temperature, min-p, top-k, top-p). A token the
        truncations drop gets ``-inf``. For diagnostics (engine vs trainer on fixed tokens) and tests.
        """
        validate_sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.repetition_penalty)
        if len(prompt_ids) != len(completion_ids) or any(len(c) == 0 for c in completion_ids):
            raise ValueError("score_ids needs one non-empty completion per prompt")
        max_new = max(len(c) for c in completion_ids)
        forced = torch.full((len(completion_ids), max_new), self.pad_token_id, dtype=torch.long)
        for row, ids in enumerate(completion_ids):
            forced[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        forced_lengths = torch.tensor([len(c) for c in completion_ids], dtype=torch.long)
        params = replace(sampling, max_new_tokens=max_new, seed=0)
        out = self._decode(
            prompt_ids, 1, params, generator=None, forced=(forced.to(self.device), forced_lengths.to(self.device))
        )
        return [out.logp[row, : len(ids)].cpu() for row, ids in enumerate(completion_ids)]

    # ---------------------------------------------------------------- the loop

    @torch.inference_mode()
    def _decode(
        self,
        prompt_ids: list[list[int]],
        samples_per_prompt: int,
        sampling: SamplingParams,
        generator: torch.Generator | list[torch.Generator] | None,
        forced: tuple[torch.Tensor, torch.Tensor] | None,
        record_routes: bool = False,
        control: DecodeControl | None = None,
    ) -> _Outputs:
        # Over 60 lines: the decode loop reads best whole (draw, record, end rows and keep them, step).
        """Prefill, then one decode step per new token; rows = prompts x samples, grouped.

        ``forced = (tokens long [B, N], lengths long [B])`` feeds given tokens instead of drawing
        (``score_ids``); a forced row stops at its length, never at EOS. ``control``: ``generate_ids``.
        """
        max_new = sampling.max_new_tokens
        running, logits, prefill_routes = self._prefill(prompt_ids, samples_per_prompt, max_new, record_routes)
        out = _Outputs.allocate(running.rows.numel(), max_new, self.pad_token_id, self.device)
        width = running.prompt_width
        if self._fast is not None and max_new > 1 and not isinstance(running.cache, StaticKVCache):
            # decode steps write their keys into [width + max_new] columns
            running.cache = StaticKVCache.from_transformers(running.cache, width + max_new, width)
        if self._fast is not None:  # rotary tables for every position of this rollout: no per-step sync
            self._fast.reserve_positions(width + max_new, self._fast.embed.dtype)
        if prefill_routes is not None:
            out.start_routes(prefill_routes, max_new)
        if self._buckets is not None and forced is None and max_new > 1:  # static buckets (graph_decode)
            draw = Draw(sampling, prompt_ids, samples_per_prompt, spare_rows=1)  # the buckets' scratch slot
            self._buckets.decode(running, logits, out, draw, generator, self.eos_ids, record_routes, max_new, control)
            return out
        draw = Draw(sampling, prompt_ids, samples_per_prompt)
        stops = self._stops(logits.shape[-1]) if forced is None else None
        budgets = None if control is None else torch.tensor(control.max_new_tokens, device=self.device)
        for step in range(max_new):
            step_forced = None if forced is None else forced[0][running.rows, step]
            step_generator = generator  # per_sample: the streams of the rows still running
            if isinstance(generator, list):
                step_generator = [generator[row] for row in running.rows.tolist()]
            tokens, logp = draw(logits, running.rows, step_generator, step_forced)
            out.tokens[running.rows, step] = tokens
            out.logp[running.rows, step] = logp
            if step == max_new - 1:
                self._keep(running, None, width, step, out, prompt_ids, samples_per_prompt)
                break
            finished = self._finished(tokens, out, running, step, stops, forced, budgets)
            if finished.any():  # finished rows leave the batch (and their caches are dropped, or kept)
                out.num_tokens[running.rows[finished]] = step + 1
                self._keep(running, finished, width, step, out, prompt_ids, samples_per_prompt)
                keep = (~finished).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                running.select(keep)
                tokens = tokens[keep]
            if control is not None and control.stops_at(step, running.rows, out.num_tokens, out.num_tokens.shape[0]):
                break
            mask = None if running.attention_mask is None else running.attention_mask[:, : width + step + 1]
            positions = running.prompt_lengths + step
            logits, step_routes = self._step(tokens, positions, width + step, mask, running.cache, record_routes)
            if out.routes is not None:  # completion token `step` sits at padded position width + step
                assert step_routes is not None  # out.routes is started only when routes are recorded
                out.routes[running.rows, width + step] = step_routes
        return out

    def _finished(self, tokens: torch.Tensor, out: _Outputs, running: _Running, step: int, stops: StopStrings | None,
                  forced: tuple[torch.Tensor, torch.Tensor] | None, budgets: torch.Tensor | None) -> torch.Tensor:
        """Which batch rows end with decode step ``step`` (bool [b]): a stop token drawn, a stop string just written
        (it leaves now, not at max_new), a row's own budget reached (``DecodeControl``); a forced row at its length."""
        if forced is not None:
            return forced[1][running.rows] <= step + 1
        finished = torch.isin(tokens, self.eos_ids)
        if stops is not None:
            finished |= stops.hit(out.tokens, running.rows, step, tokens)
        if budgets is not None:
            finished |= budgets[running.rows] <= step + 1
        return finished

    def _keep(self, running: _Running, ending: torch.Tensor | None, width: int, step: int, out: _Outputs,
              prompt_ids: list[list[int]], group: int) -> None:
        """Inside ``keeping_prefixes``: keep the ending batch rows' (bool [b]; None: all) fed tokens (prompt and
        completion, not the token just drawn at ``step``), each layer's keys and values of them, and their routes."""
        if self._prefixes is None:
            return
        batch_rows = torch.arange(running.rows.numel()) if ending is None else ending.nonzero().squeeze(-1)
        cache = running.cache
        pairs = list(zip(cache.keys, cache.values)) if isinstance(cache, StaticKVCache) else \
            [(layer.keys, layer.values) for layer in cache.layers]
        for b in batch_rows.tolist():
            row, start = int(running.rows[b]), width - int(running.prompt_lengths[b])
            ids = list(prompt_ids[row // group]) + out.tokens[row, :step].tolist()
            self._prefixes.append(_Kept(
                ids, [k[b:b + 1, :, start:width + step].clone() for k, _ in pairs],
                [v[b:b + 1, :, start:width + step].clone() for _, v in pairs],
                None if out.routes is None else out.routes[row, start:width + step].clone()))

    @staticmethod
    def _kept_prefix(ids: list[int], kept: dict[tuple[int, ...], _Kept], lengths: list[int]) -> tuple[_Kept, int] | None:
        """The longest kept row (``kept`` by its tokens; their ``lengths``, longest first) whose tokens begin ``ids``
        with at least one token of ``ids`` left to feed, and its length; None for none."""
        for length in lengths:
            if length < len(ids) and (row := kept.get(tuple(ids[:length]))) is not None:
                return row, length
        return None

    def _prefill_kept(self, prompt_ids: list[list[int]], kept: list[tuple[_Kept, int] | None], group: int, max_new: int,
                      record_routes: bool) -> tuple[_Running, torch.Tensor, torch.Tensor | None]:
        # Over 60 lines: the kept caches laid out for one call, the call, and the rows laid out again, in one place.
        """``_prefill`` where some prompts begin with a kept row's tokens: one model call feeds the rest of every prompt
        (left-padded, after the kept keys and values of its start, right-aligned: a gap of masked columns between
        them), then each row's columns are laid out again as ``_prefill`` leaves them (left padding only)."""
        done = [0 if hit is None else hit[1] for hit in kept]
        rests = [ids[d:] for ids, d in zip(prompt_ids, done, strict=True)]
        start, block = max(done), max(len(rest) for rest in rests)
        batch = len(prompt_ids)
        cache = self._new_cache()
        rows = [hit[0] for hit in kept if hit is not None]
        for layer in range(len(rows[0].keys)):
            k = rows[0].keys[layer].new_zeros(batch, rows[0].keys[layer].shape[1], start, rows[0].keys[layer].shape[3])
            v = rows[0].values[layer].new_zeros(batch, rows[0].values[layer].shape[1], start, rows[0].values[layer].shape[3])
            for i, hit in enumerate(kept):
                if hit is not None and done[i]:
                    k[i, :, start - done[i]:] = hit[0].keys[layer][0, :, :done[i]]
                    v[i, :, start - done[i]:] = hit[0].values[layer][0, :, :done[i]]
            DynamicCache.update(cache, k, v, layer)  # as kept (an fp8 cache's values are already rounded)
        mask = torch.zeros(batch, start + block, dtype=torch.bool)
        input_ids = torch.full((batch, block), self.pad_token_id, dtype=torch.long)
        positions = torch.zeros(batch, block, dtype=torch.long)
        for i, rest in enumerate(rests):
            mask[i, start - done[i]:start] = True
            mask[i, start + block - len(rest):] = True
            input_ids[i, block - len(rest):] = torch.tensor(rest, dtype=torch.long)
            positions[i, block - len(rest):] = torch.arange(done[i], done[i] + len(rest))
        mask, input_ids, positions = mask.to(self.device), input_ids.to(self.device), positions.to(self.device)
        logits, new_routes = self._forward(input_ids, mask, positions, cache, record_routes, logits_to_keep=1)
        width = max(len(ids) for ids in prompt_ids)
        laid = self._new_cache()
        for layer, (keys, values) in enumerate((c.keys, c.values) for c in cache.layers):
            k = keys.new_zeros(batch, keys.shape[1], width, keys.shape[3])
            v = values.new_zeros(batch, values.shape[1], width, values.shape[3])
            for i in range(batch):
                valid = mask[i].nonzero().squeeze(-1)
                k[i, :, width - valid.numel():] = keys[i, :, valid]
                v[i, :, width - valid.numel():] = values[i, :, valid]
            DynamicCache.update(laid, k, v, layer)
        routes = None
        if new_routes is not None:
            routes = torch.full((batch, width, *new_routes.shape[2:]), -1, dtype=torch.int16, device=new_routes.device)
            for i, hit in enumerate(kept):
                fed = new_routes[i, block - len(rests[i]):]
                if hit is not None:
                    assert hit[0].routes is not None  # _kept_prefix matches only rows with routes when recording
                    fed = torch.cat([hit[0].routes[:done[i]], fed])
                routes[i, width - len(prompt_ids[i]):] = fed
        prompt_mask, _ = self._left_pad(prompt_ids)
        return self._grouped(prompt_mask, laid, logits[:, -1], routes, group, max_new)

    def _stops(self, vocab_size: int) -> StopStrings | None:
        """The in-loop stop-string check (``minirl.rollout.stop_strings``), or None without stop strings."""
        if not self.stop_strings or self.tokenizer is None:
            return None
        if self._stop_check is None:
            self._stop_check = StopStrings(self.tokenizer, self.stop_strings, vocab_size, self.device)
        return self._stop_check

    def _prefill(
        self, prompt_ids: list[list[int]], group: int, max_new: int, record_routes: bool
    ) -> tuple[_Running, torch.Tensor, torch.Tensor | None]:
        """Run the left-padded prompts once each; expand cache, logits and routes to G rows each."""
        if any(len(ids) == 0 for ids in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if self._prefixes:  # the rows the call before kept (this call keeps its own in their place)
            rows = {tuple(row.ids): row for row in self._prefixes if not (record_routes and row.routes is None)}
            self._prefixes = []
            lengths = sorted({len(key) for key in rows}, reverse=True)
            kept = [self._kept_prefix(ids, rows, lengths) for ids in prompt_ids]
            if any(hit is not None for hit in kept):
                return self._prefill_kept(prompt_ids, kept, group, max_new, record_routes)
        prompt_mask, input_ids = self._left_pad(prompt_ids)
        num_prompts, width = input_ids.shape
        position_ids = (prompt_mask.cumsum(dim=1) - 1).clamp_(min=0)
        # Mask over [prompt | completion] columns, sliced as they fill. Without padding there is
        # nothing to mask: pass None (causal attention, and the faster unmasked SDPA path).
        attention_mask = None
        if not bool(prompt_mask.all()):
            completion_mask = torch.ones(num_prompts, max_new, dtype=torch.bool, device=self.device)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        # bf16 / fp16 through fp32 GEMMs: prefill too (not a hybrid's: its linear attention has no fast prefill)
        if self._fast is not None and self._fast.fp32_gemm and not self._fast.hybrid:
            key_mask = None if attention_mask is None else prompt_mask
            logits, cache, routes = self._fast.prefill(input_ids, position_ids, key_mask, max_new, record_routes)
        else:
            cache = self._new_cache()
            prefill_mask = None if attention_mask is None else attention_mask[:, :width]
            logits, routes = self._forward(input_ids, prefill_mask, position_ids, cache, record_routes, logits_to_keep=1)
            logits = logits[:, -1]
        return self._grouped(prompt_mask, cache, logits, routes, group, max_new)

    def _grouped(self, prompt_mask: torch.Tensor, cache: Any, logits: torch.Tensor, routes: torch.Tensor | None,
                 group: int, max_new: int) -> tuple[_Running, torch.Tensor, torch.Tensor | None]:
        """The decode batch of prefilled prompts (left-padded ``prompt_mask`` [P, W]), each repeated ``group`` times."""
        num_prompts, width = prompt_mask.shape
        attention_mask = None  # over [prompt | completion] columns; none without padding (causal, unmasked SDPA)
        if not bool(prompt_mask.all()):
            completion_mask = torch.ones(num_prompts, max_new, dtype=torch.bool, device=self.device)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        running = _Running(
            rows=torch.arange(num_prompts * group, device=self.device),
            prompt_lengths=prompt_mask.sum(dim=1),
            prompt_width=width,
            attention_mask=attention_mask,
            cache=cache,
        )
        if group > 1:  # each of the G samples of a prompt starts from a copy of its cache
            repeat_rows(cache, group)
            logits = logits.repeat_interleave(group, dim=0)
            routes = None if routes is None else routes.repeat_interleave(group, dim=0)
            running.prompt_lengths = running.prompt_lengths.repeat_interleave(group, dim=0)
            if attention_mask is not None:
                running.attention_mask = attention_mask.repeat_interleave(group, dim=0)
        return running, logits, routes

    def _step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        column: int,
        mask: torch.Tensor | None,
        cache: Any,
        record_routes: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed one token per row (long [b]); returns (logits [b, V], routes int16 [b, L, K] or None)."""
        if self._fast is not None:
            return self._fast.step(tokens, positions, column, mask, cache, record_routes)
        logits, routes = self._forward(tokens[:, None], mask, positions[:, None], cache, record_routes)
        return logits[:, -1], None if routes is None else routes[:, 0]

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        cache: Any,
        record_routes: bool,
        logits_to_keep: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One model call with the cache; returns (logits [B, T', V], routes int16 [B, T, L, K] or None)."""
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_kwarg: cache,
            "use_cache": True,
            "logits_to_keep": logits_to_keep,
        }
        if not record_routes:
            return self.model(**kwargs).logits, None
        with self._routing_replay().record() as recording:
            logits = self.model(**kwargs).logits
        return logits, recording.routes.to(torch.int16)

    def _routing_replay(self) -> Any:
        if self._replay is None:
            try:
                from minirl.moe import RoutingReplay
            except ImportError as error:  # pragma: no cover - depends on the installed tree
                raise ImportError("record_routes=True needs minirl.moe.RoutingReplay") from error
            self._replay = RoutingReplay(self.model)
        return self._replay

    def _new_cache(self) -> Any:
        return new_cache(self.model.config, self.kv_cache_precision)

    def _left_pad(self, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask bool [P, W], ids long [P, W]) with each prompt right-aligned, pads on the left."""
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(prompt_ids), width, dtype=torch.bool)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, width - len(ids) :] = True
        return mask.to(self.device), input_ids.to(self.device)

    # ---------------------------------------------------------------- output

    def _completions(self, prompt_ids: list[list[int]], group: int, out: _Outputs) -> list[Completion]:
        tokens, logp, num_tokens = out.tokens.cpu(), out.logp.cpu(), out.num_tokens.tolist()
        # a row stopped by EOS ends with it (a row at the limit may also have drawn EOS last)
        ended_by_eos = torch.isin(out.tokens.gather(1, (out.num_tokens - 1)[:, None]).squeeze(1), self.eos_ids)
        routes = None if out.routes is None else out.routes.cpu()
        prompt_width = max(len(ids) for ids in prompt_ids)
        completions = []
        for row, length in enumerate(num_tokens):
            prompt_index, sample_index = divmod(row, group)
            prompt = list(prompt_ids[prompt_index])
            completion_ids = tokens[row, :length].tolist()
            row_routes = None
            if routes is not None:  # the last sampled token was never fed: its row stayed -1
                row_routes = routes[row, prompt_width - len(prompt) : prompt_width + length].clone()
            completions.append(
                Completion(
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    prompt_ids=prompt,
                    completion_ids=completion_ids,
                    logp_rollout=logp[row, :length].clone(),
                    finish_reason="eos" if bool(ended_by_eos[row]) else "length",
                    text=self._decode_text(completion_ids),
                    routes=row_routes,
                )
            )
        return completions

    def _decode_text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _own_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in fp32, without its hooks and gradients.

    A deep copy (not a rebuild from the config) keeps any module surgery on the trainer's model.
    Hooks are left behind (routing replay hooks on the trainer's routers must not fire in the
    engine, nor be copied with whatever they reference), and so are ``.grad`` tensors.
    """
    memo: dict[int, Any] = {}
    for module in model.modules():
        for attribute in _HOOK_DICTS:
            hooks = getattr(module, attribute, None)
            if hooks is not None:
                memo[id(hooks)] = type(hooks)()
    for param in model.parameters():
        if param.grad is not None:
            memo[id(param.grad)] = None
    return copy.deepcopy(model, memo).float()


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


@dataclass
class _Running:
    """The decode batch: which original rows still run, and what their next forward needs."""

    rows: torch.Tensor  # long [b]: original row (prompt-major) of each batch row
    prompt_lengths: torch.Tensor  # long [b]: unpadded prompt length; next position = length + step
    prompt_width: int  # P: the left-padded prompt width
    attention_mask: torch.Tensor | None  # bool [b, P + N] over prompt and completion columns
    cache: Any  # transformers Cache holding the b rows

    def select(self, keep: torch.Tensor) -> None:
        """Keep only batch rows ``keep`` (long [b'])."""
        self.rows = self.rows[keep]
        self.prompt_lengths = self.prompt_lengths[keep]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[keep]
        select_rows(self.cache, keep)


@dataclass
class _Kept:
    """A row that ended inside ``NativeEngine.keeping_prefixes``: its fed tokens, each layer's keys and values of them
    ([1, kv heads, tokens, head dim]) and their routes (int16 [tokens, L, K], or None when not recorded)."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: torch.Tensor | None


@dataclass
class _Outputs:
    """Per original row: tokens, log-probs, how many tokens it kept, and (R3) its routes."""

    tokens: torch.Tensor  # long [B, N], pad after the end
    logp: torch.Tensor  # float32 [B, N]
    num_tokens: torch.Tensor  # long [B]
    routes: torch.Tensor | None = None  # int16 [B, P + N, L, K], -1 where nothing was fed

    @classmethod
    def allocate(cls, num_rows: int, max_new: int, pad_token_id: int, device: torch.device) -> _Outputs:
        return cls(
            tokens=torch.full((num_rows, max_new), pad_token_id, dtype=torch.long, device=device),
            logp=torch.zeros(num_rows, max_new, dtype=torch.float32, device=device),
            num_tokens=torch.full((num_rows,), max_new, dtype=torch.long, device=device),
        )

    def start_routes(self, prefill_routes: torch.Tensor, max_new: int) -> None:
        """Allocate the routes buffer and fill the prompt columns with the prefill's routes."""
        num_rows, width, num_layers, top_k = prefill_routes.shape
        self.routes = torch.full(
            (num_rows, width + max_new, num_layers, top_k), -1, dtype=torch.int16, device=prefill_routes.device
        )
        self.routes[:, :width] = prefill_routes
