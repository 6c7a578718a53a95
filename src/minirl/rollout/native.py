"""``NativeEngine``: minirl's built-in rollout engine, a batched KV-cache sampler over a HF model.

It keeps its own copy of the policy's weights in a configurable precision (``precision.py``), so
that on CPU the engine can differ from the fp32 trainer the way an FP8 or bf16 inference engine
differs from its trainer on GPUs. It reports, for each sampled token, the log-probability under
the distribution it actually sampled from (``logp_rollout``, mu_old) and, on request, the top-k
experts each MoE layer chose for each fed token (``routes``, for R3).

The loop, in one sentence per step:
    left-pad the prompts (prefill each distinct prompt once, then repeat its cache G times);
    positions are ``cumsum(mask) - 1`` so a padded row computes what the unpadded prompt would;
    each decode step feeds the last sampled token of every still-running row, with the cache;
    rows that sampled EOS (or any of the EOS ids) leave the batch; the rest run to
    ``max_new_tokens`` (finish reason ``"length"``). The EOS token is part of the completion and
    has a log-prob; the last sampled token of every row is never fed, so its route row is -1.

Randomness: one ``torch.Generator`` per seed value. The first call with ``sampling.seed = s``
seeds it with ``s``; later calls with the same seed continue that stream. So a loop that passes
a new seed each step (``minirl.loop`` does) gets samples that depend only on that step's seed,
and a loop passing the same seed every step does not repeat its samples; an evaluation call
with its own seed in between disturbs neither. The ``MAX_STREAMS`` most recently used streams
are kept. ``get_rng_state``/``set_rng_state`` checkpoint them.
"""

from __future__ import annotations

import copy
import inspect
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from minirl.rollout.precision import (
    Precision,
    ScaleMode,
    apply_precision,
    compute_dtype_of,
    fake_quantize_fp8_e4m3,
    fp8_parameter_names,
)
from minirl.rollout.sampling import sample_next, validate_sampling
from minirl.types import Completion, Prompt, SamplingParams


MAX_STREAMS = 8  # sampling streams (one per seed value) kept, least recently used dropped first


class NativeEngine:
    """Batched sampling with a KV cache over a Hugging Face causal LM, in a chosen precision.

    Args:
        model: the trainer's model (a ``transformers`` causal LM). The engine builds its own copy
            (same class and config, weights copied in); the trainer's module is never touched.
        eos_token_id: id (or ids) that end a completion.
        pad_token_id: id used for left padding (never attended to).
        precision: ``"fp32" | "bf16" | "fp16" | "fp8_e4m3"``, see ``minirl.rollout.precision``.
        fp8_scale: ``"per_tensor" | "per_expert"`` (fp8 only).
        compute_dtype: activation dtype for ``fp8_e4m3`` (``"fp32"`` default, or ``"bf16"``).
        tokenizer: needed only by ``generate`` (text prompts) and for ``Completion.text``.
        device: where the engine's copy lives.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        precision: Precision = "fp32",
        fp8_scale: ScaleMode = "per_tensor",
        compute_dtype: str | None = None,
        tokenizer: Any = None,
        device: str | torch.device = "cpu",
    ) -> None:
        eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if not eos_ids:
            raise ValueError("eos_token_id must name at least one token id")
        self.precision = precision
        self.fp8_scale = fp8_scale
        self.compute_dtype = compute_dtype_of(precision, compute_dtype)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.pad_token_id = int(pad_token_id)
        self.eos_ids = torch.tensor(eos_ids, dtype=torch.long, device=self.device)

        self.model = _own_copy(model).to(self.device).eval().requires_grad_(False)
        self._fp8_names = set(fp8_parameter_names(self.model)) if precision == "fp8_e4m3" else set()
        apply_precision(self.model, precision, fp8_scale=fp8_scale, compute_dtype=compute_dtype)
        self._params = list(self.model.named_parameters())
        self._persistent_buffers = [
            (name, buffer) for name, buffer in self.model.named_buffers() if name in self.model.state_dict()
        ]
        self._cache_kwarg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self._generators: OrderedDict[int, torch.Generator] = OrderedDict()
        self._replay: Any = None  # minirl.moe.RoutingReplay over self.model, built on first use

    # ---------------------------------------------------------------- weights

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy the trainer's weights in (in place, no re-instantiation), re-applying the precision.

        fp8 parameters are fake-quantised from the incoming (full-precision) tensor, so weights
        are rounded once per load, never twice.
        """
        missing = [name for name, _ in self._params if name not in state_dict]
        if missing:
            raise KeyError(f"load_weights: state dict lacks {len(missing)} parameter(s), e.g. {missing[:3]}")
        for name, param in self._params:
            source = state_dict[name]
            if name in self._fp8_names:
                source = fake_quantize_fp8_e4m3(source.to(param.device), self.fp8_scale, param.dtype)
            param.copy_(source)
        for name, buffer in self._persistent_buffers:
            if name in state_dict:
                buffer.copy_(state_dict[name])

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

    # ---------------------------------------------------------------- sampling

    def generate(
        self,
        prompts: list[Prompt],
        samples_per_prompt: int,
        sampling: SamplingParams,
        record_routes: bool = False,
    ) -> list[Completion]:
        """``RolloutEngine.generate``: tokenise each ``Prompt.text`` and call ``generate_ids``."""
        if self.tokenizer is None:
            raise ValueError("NativeEngine.generate needs a tokenizer; pass token ids to generate_ids instead")
        prompt_ids = [list(self.tokenizer.encode(prompt.text)) for prompt in prompts]
        return self.generate_ids(prompt_ids, samples_per_prompt, sampling, record_routes)

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        samples_per_prompt: int,
        sampling: SamplingParams,
        record_routes: bool = False,
    ) -> list[Completion]:
        """Sample ``samples_per_prompt`` completions of each prompt, grouped by prompt.

        ``sampling.temperature`` must be > 0 (see ``sampling.validate_sampling``).
        """
        validate_sampling(sampling.temperature, sampling.top_p)
        if samples_per_prompt < 1 or sampling.max_new_tokens < 1:
            raise ValueError("samples_per_prompt and sampling.max_new_tokens must be >= 1")
        result = self._decode(
            prompt_ids,
            samples_per_prompt,
            sampling,
            generator=self._generator(int(sampling.seed)),
            forced=None,
            record_routes=record_routes,
        )
        return self._completions(prompt_ids, samples_per_prompt, result)

    def score_ids(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], sampling: SamplingParams
    ) -> list[torch.Tensor]:
        """Log-probs (float32, one tensor per row) the engine assigns to given completions.

        Runs the same batched KV-cache path as sampling, feeding the given tokens instead of
        drawing them, under the law ``sampling`` describes (temperature, top-p). A token outside
        the nucleus gets ``-inf``. For diagnostics (engine vs trainer on fixed tokens) and tests.
        """
        validate_sampling(sampling.temperature, sampling.top_p)
        if len(prompt_ids) != len(completion_ids) or any(len(c) == 0 for c in completion_ids):
            raise ValueError("score_ids needs one non-empty completion per prompt")
        max_new = max(len(c) for c in completion_ids)
        forced = torch.full((len(completion_ids), max_new), self.pad_token_id, dtype=torch.long)
        for row, ids in enumerate(completion_ids):
            forced[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        forced_lengths = torch.tensor([len(c) for c in completion_ids], dtype=torch.long)
        params = SamplingParams(max_new_tokens=max_new, temperature=sampling.temperature, top_p=sampling.top_p)
        result = self._decode(
            prompt_ids, 1, params, generator=None, forced=(forced.to(self.device), forced_lengths.to(self.device))
        )
        return [result["logp"][row, : len(ids)].cpu() for row, ids in enumerate(completion_ids)]

    # ---------------------------------------------------------------- the loop

    @torch.inference_mode()
    def _decode(
        self,
        prompt_ids: list[list[int]],
        samples_per_prompt: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        forced: tuple[torch.Tensor, torch.Tensor] | None,
        record_routes: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Prefill + decode. Returns padded per-row tensors (rows = prompts x samples, grouped).

        ``tokens`` long [B, N], ``logp`` float32 [B, N], ``num_tokens`` long [B], ``eos`` bool [B],
        ``routes`` int16 [B, P + N, L, K] or absent (P = longest prompt, left-padded).
        """
        if any(len(ids) == 0 for ids in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        device, group = self.device, samples_per_prompt
        max_new = sampling.max_new_tokens
        prompt_mask, input_ids = self._left_pad(prompt_ids)
        num_prompts, prompt_width = input_ids.shape
        num_rows = num_prompts * group
        prompt_lengths = prompt_mask.sum(dim=1)
        position_ids = (prompt_mask.cumsum(dim=1) - 1).clamp_(min=0)
        # Mask over [prompt | completion] columns, sliced as they fill. Without padding there is
        # nothing to mask: pass None (causal attention, and the faster unmasked SDPA path).
        attention_mask = None
        if not bool(prompt_mask.all()):
            attention_mask = torch.cat(
                [prompt_mask, torch.ones(num_prompts, max_new, dtype=torch.bool, device=device)], dim=1
            )

        cache = self._new_cache()
        logits, prefill_routes = self._forward(
            input_ids,
            None if attention_mask is None else attention_mask[:, :prompt_width],
            position_ids,
            cache,
            record_routes,
            logits_to_keep=1,
        )
        # Prefill once per distinct prompt, then give each of its G samples a copy of the cache.
        if group > 1:
            cache.batch_repeat_interleave(group)
            logits = logits.repeat_interleave(group, dim=0)
            prompt_lengths = prompt_lengths.repeat_interleave(group, dim=0)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(group, dim=0)

        tokens_out = torch.full((num_rows, max_new), self.pad_token_id, dtype=torch.long, device=device)
        logp_out = torch.zeros(num_rows, max_new, dtype=torch.float32, device=device)
        num_tokens = torch.full((num_rows,), max_new, dtype=torch.long, device=device)
        eos_out = torch.zeros(num_rows, dtype=torch.bool, device=device)
        routes_out = None
        if record_routes:
            num_layers, top_k = prefill_routes.shape[-2:]
            routes_out = torch.full(
                (num_rows, prompt_width + max_new, num_layers, top_k), -1, dtype=torch.int16, device=device
            )
            routes_out[:, :prompt_width] = prefill_routes.repeat_interleave(group, dim=0)
        if forced is not None:
            forced_tokens, row_limits = forced
        else:
            forced_tokens, row_limits = None, None

        rows = torch.arange(num_rows, device=device)  # original row of each batch row still running
        all_rows = True  # rows is still arange(num_rows): plain slices instead of index_put
        for step in range(max_new):
            step_forced = None if forced_tokens is None else forced_tokens[rows, step]
            tokens, logp = sample_next(logits[:, -1], sampling.temperature, sampling.top_p, generator, step_forced)
            if all_rows:
                tokens_out[:, step] = tokens
                logp_out[:, step] = logp
            else:
                tokens_out[rows, step] = tokens
                logp_out[rows, step] = logp
            if step == max_new - 1:
                break
            if row_limits is None:
                finished = torch.isin(tokens, self.eos_ids)
            else:
                finished = row_limits[rows] <= step + 1
            if finished.any():
                done_rows = rows[finished]
                num_tokens[done_rows] = step + 1
                if row_limits is None:
                    eos_out[done_rows] = True
                keep = (~finished).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                rows, tokens, all_rows = rows[keep], tokens[keep], False
                prompt_lengths = prompt_lengths[keep]
                if attention_mask is not None:
                    attention_mask = attention_mask[keep]
                cache.batch_select_indices(keep)
            logits, step_routes = self._forward(
                tokens[:, None],
                None if attention_mask is None else attention_mask[:, : prompt_width + step + 1],
                (prompt_lengths + step)[:, None],
                cache,
                record_routes,
            )
            if routes_out is not None:
                routes_out[rows, prompt_width + step] = step_routes[:, 0]
        if row_limits is None:
            # rows that ran to the limit may still have sampled EOS as their very last token
            last = tokens_out.gather(1, (num_tokens - 1)[:, None]).squeeze(1)
            eos_out |= torch.isin(last, self.eos_ids)
        result = {"tokens": tokens_out, "logp": logp_out, "num_tokens": num_tokens, "eos": eos_out}
        if routes_out is not None:
            result["routes"] = routes_out
        return result

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
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

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

    def _completions(
        self, prompt_ids: list[list[int]], group: int, result: dict[str, torch.Tensor]
    ) -> list[Completion]:
        tokens = result["tokens"].cpu()
        logp = result["logp"].cpu()
        num_tokens = result["num_tokens"].tolist()
        eos = result["eos"].tolist()
        routes = result["routes"].cpu() if "routes" in result else None
        prompt_width = max(len(ids) for ids in prompt_ids)
        completions = []
        for row, length in enumerate(num_tokens):
            prompt_index, sample_index = divmod(row, group)
            prompt = list(prompt_ids[prompt_index])
            completion_ids = tokens[row, :length].tolist()
            row_routes = None
            if routes is not None:
                row_routes = routes[row, prompt_width - len(prompt) : prompt_width + length].clone()
                row_routes[-1] = -1  # the last sampled token was never fed through the model
            completions.append(
                Completion(
                    prompt_index=prompt_index,
                    sample_index=sample_index,
                    prompt_ids=prompt,
                    completion_ids=completion_ids,
                    logp_rollout=logp[row, :length].clone(),
                    finish_reason="eos" if eos[row] else "length",
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
