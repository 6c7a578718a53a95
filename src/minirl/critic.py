"""The learned value model of PPO (``algo.adv_baseline: critic``; verl's ``critic`` worker with ``adv_estimator: gae``).

``build_critic`` makes it as verl does: the policy's transformer under a scalar head, a transformers
``AutoModelForTokenClassification`` with one label (the policy's starting weights, or ``critic.model_path``'s; the
head starts fresh), or, for an architecture transformers has no such class for (OLMoE, DeepSeek-V2, GLM-4-MoE, ...),
its ``AutoModel`` under a linear head (``ValueModel``, as verl falls back to a value-head wrapper). ``Critic.values`` scores a batch: V at the position before each target token, the state the
token was sampled from (the log-probs' alignment); ``Critic.update`` takes one AdamW step of the clipped value loss
(``minirl.algo.variants.gae``) on a mini-batch, normalised by its trained tokens (verl's ``token-mean``). The critic
routes naturally (R2/R3 replay the policy's routes only) and computes in ``optim.precision``. In one process it is the
controller's; beside FSDP trainer ranks (``cluster.trainer_ranks``, or Ray actors) each rank holds its FSDP2 shards of
it and scores and trains on its rows of every batch (``minirl.distributed.group.GroupCritic``), as verl's critic is a
data-parallel worker of its own: the loss is divided by the whole mini-batch's tokens or responses (``update``'s
``totals``) and the shards' gradients summed, so W ranks take the single process's step.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch

from minirl.algo.variants.gae import value_loss
from minirl.batching import micro_batches
from minirl.config import ConfigError
from minirl.models.padding_free import Packing, packed_forward
from minirl.precision import LossScale, autocast_experts, compute_context
from minirl.trainer import (
    compute_device,
    disable_stochastic_layers,
    full_optimizer_state,
    full_state,
    load_full_optimizer_state,
    load_full_state,
    lr_factor,
)
from minirl.types import Batch


def build_critic(cfg: Any, policy: torch.nn.Module, *, shard: Callable[[torch.nn.Module], None] | None = None) -> Critic:
    """The critic of ``cfg`` (``critic.*``): ``policy``'s weights (as the run starts, before LoRA) under a new head, or
    ``critic.model_path``'s model. The head's initialisation draws from its own seeded stream, not the run's.
    ``shard`` (an FSDP rank's ``fully_shard`` of the model) runs before the optimizer is made over its parameters."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING

    c, source = cfg.critic, cast(Any, policy)
    if c.model_path is not None and not (Path(c.model_path).expanduser() / "config.json").is_file():
        raise ConfigError(f"critic.model_path: {c.model_path} is not a Hugging Face model directory (no config.json)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.run.seed)
        config = copy.deepcopy(source.config) if c.model_path is None else AutoConfig.from_pretrained(
            c.model_path, trust_remote_code=cfg.model.trust_remote_code)
        config.num_labels = 1
        if type(config) in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING:
            head: Any = AutoModelForTokenClassification
        else:  # no TokenClassification class for this architecture: its transformer under a linear head
            head = ValueModel
        if c.model_path is not None:
            model = head.from_pretrained(c.model_path, config=config, dtype=torch.float32,
                                         trust_remote_code=cfg.model.trust_remote_code)
        else:
            model = head.from_config(config, dtype=torch.float32)
            model.base_model.load_state_dict(source.base_model.state_dict())
    if c.lora is not None:  # the adapters and the value head train
        from minirl.models.lora import add_lora

        value_head = model.score
        add_lora(model, rank=c.lora.rank, alpha=c.lora.alpha, dropout=c.lora.dropout,
                 target_modules=c.lora.target_modules, adapt_routers=c.lora.adapt_routers, head=value_head,
                 target_parameters=c.lora.target_parameters)
        value_head.requires_grad_(True)
    o = cfg.optim
    names = [name for name, param in model.named_parameters() if param.requires_grad]  # the optimizer's, in order
    if shard is None or not cfg.optim.cpu_offload:  # offloaded, fully_shard moves it a layer at a time
        model.to(cfg.cluster.device)
    if shard is not None:
        shard(model)
    return Critic(model, names=names, collective=shard is not None, lr=c.lr, lr_warmup_updates=c.lr_warmup_updates, weight_decay=c.weight_decay, betas=(o.adam_beta1, o.adam_beta2),
                  eps=o.adam_eps, grad_clip_norm=c.grad_clip_norm, clip_value_range=c.clip_value_range,
                  micro_batch_sequences=o.micro_batch_sequences, micro_batch_max_tokens=o.micro_batch_max_tokens,
                  precision=o.precision, loss_scale=LossScale.of(o), loss_aggregation=c.loss_aggregation, horizon_tokens=cfg.rollout.max_new_tokens,
                  padding_free=o.padding_free, shared_prompt=o.shared_prompt)


class ValueModel(torch.nn.Module):
    """An architecture's ``AutoModel`` under a linear head, initialised as transformers initialises a
    TokenClassification ``score`` (normal, std ``initializer_range``; bias 0); ``forward`` returns ``.logits`` [B, S, 1]."""

    def __init__(self, base: torch.nn.Module, hidden_size: int, std: float) -> None:
        super().__init__()
        self.model = base
        self.score = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.normal_(self.score.weight, std=std)
        torch.nn.init.zeros_(self.score.bias)

    @property
    def base_model(self) -> torch.nn.Module:
        return self.model

    @property
    def config(self) -> Any:
        return self.model.config

    @classmethod
    def _wrap(cls, base: Any) -> ValueModel:
        text = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        return cls(base, text.hidden_size, getattr(text, "initializer_range", 0.02))

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> ValueModel:
        from transformers import AutoModel

        return cls._wrap(AutoModel.from_config(config, **kwargs))

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> ValueModel:
        from transformers import AutoModel

        return cls._wrap(AutoModel.from_pretrained(path, **kwargs))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """``kwargs`` go to the transformer (a padding-free forward's ``position_ids`` and packing)."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        return SimpleNamespace(logits=self.score(hidden))


class Critic:
    """V_phi and its optimizer; ``values`` and ``update`` take ``minirl.types.Batch``es (their ``mask`` says which
    target positions count). ``padding_free`` / ``shared_prompt`` (``optim.padding_free`` / ``optim.shared_prompt``,
    verl's ``critic.model.use_remove_padding``): its forwards run on the real tokens only, and with ``shared_prompt``
    each prompt of a micro-batch once, as the policy's do (``minirl.models.padding_free``)."""

    def __init__(self, model: torch.nn.Module, *, names: list[str] | None = None, collective: bool = False, lr: float = 1e-5, lr_warmup_updates: int = 0, weight_decay: float = 0.01,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, grad_clip_norm: float | None = 1.0,
                 clip_value_range: float = 0.5, micro_batch_sequences: int = 64, micro_batch_max_tokens: int | None = None,
                 precision: str = "fp32", loss_scale: LossScale | None = None, loss_aggregation: str = "token_mean", horizon_tokens: int = 1,
                 padding_free: bool = False, shared_prompt: bool = False) -> None:
        self.model, self.collective = model, collective  # collective: FSDP2 shards, every call made on every rank
        self.names = names or [name for name, param in model.named_parameters() if param.requires_grad]
        disable_stochastic_layers(model)  # V at theta_old is the V the update starts from
        if precision != "fp32":
            autocast_experts(model)
        self.device = compute_device(model)
        self.precision, self.clip_value_range, self.grad_clip_norm = precision, clip_value_range, grad_clip_norm
        self.loss_scale = loss_scale or LossScale(precision)  # fp16's dynamic loss scale (the policy trainer keeps its own)
        self.loss_aggregation, self.horizon_tokens = loss_aggregation, horizon_tokens  # seq_sum_norm's constant
        self.micro_batch_sequences, self.micro_batch_max_tokens = micro_batch_sequences, micro_batch_max_tokens
        self._packed = packed_forward(model, padding_free, shared_prompt)  # refuses a model in one line now
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, functools.partial(
            lr_factor, warmup_updates=lr_warmup_updates))

    def _values(self, micro: Batch) -> torch.Tensor:
        """V [b, T] of a micro-batch (with gradient when enabled), 0 off its ``mask``."""
        with compute_context(self.precision, self.device):
            input_ids = micro.input_ids.to(self.device)
            if self._packed is not None:  # the real tokens only (zeros at padding), each shared prompt once
                prompts = self._packed.prompts(micro.input_ids, micro.mask)  # routes: the critic replays none
                logits = self._packed(input_ids, Packing.of(micro.attention_mask, self.device, prompts), use_cache=False)
            else:
                logits = self.model(input_ids=input_ids, attention_mask=micro.attention_mask.to(self.device).long()).logits
        return logits[:, :-1, 0].float() * micro.mask.to(self.device)

    def _micro_batches(self, batch: Batch) -> list[tuple[Any, Batch]]:
        """Rows of at most ``micro_batch_sequences`` (and, with ``micro_batch_max_tokens``, the trainer's token budget;
        on FSDP ranks as many as the rank that needs the most), each micro-batch trimmed to its longest row: the
        trainer's ``minirl.batching.micro_batches``."""
        packed, budget = self._packed, self.micro_batch_max_tokens  # shared prompts: a prompt counted once
        prompts = packed.prompts(batch.input_ids, batch.mask) if packed is not None and budget is not None else None
        return micro_batches(batch, self.micro_batch_sequences, budget, padded=packed is None,
                             agree_device=self.device if self.collective else None, prompts=prompts)

    @torch.no_grad()
    def values(self, batch: Batch) -> torch.Tensor:
        """V_phi [B, T] at every target position of ``batch`` (0 where ``batch.mask`` is False)."""
        self.model.eval()
        values = torch.zeros(batch.mask.shape, dtype=torch.float32)
        for rows, micro in self._micro_batches(batch):
            v = self._values(micro).cpu()
            values[rows, : v.shape[1]] = v
        if not bool(torch.isfinite(values).all()):
            raise FloatingPointError("non-finite critic value (a NaN in the value model's forward)")
        return values

    def update(self, batch: Batch, values_old: torch.Tensor, returns: torch.Tensor, *,
               totals: tuple[int, int] | None = None) -> dict[str, float]:
        """One optimizer step of the clipped value loss on ``batch`` against ``returns`` (G) from ``values_old``
        (V_old, the values the returns were formed with), both [B, T]; its metrics (verl's ``critic/*``). ``totals``:
        the whole mini-batch's (trained tokens, responses with one) when ``batch`` is an FSDP rank's share of it; the
        loss and the token-weighted metrics are then this rank's parts of the whole's (their sums over the ranks)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        per_row = batch.mask.sum(dim=1, keepdim=True)
        whole = totals if totals is not None else (int(batch.mask.sum()), int((per_row > 0).sum()))
        tokens, responses = (torch.tensor(max(int(n), 1)) for n in whole)
        divisor = {"token_mean": tokens.expand_as(per_row), "seq_sum": responses.expand_as(per_row),
                   "seq_sum_norm": (responses * self.horizon_tokens).expand_as(per_row),
                   "seq_mean": responses * per_row.clamp(min=1)}[self.loss_aggregation].to(torch.float32)
        loss_sum = clipped = predicted = torch.zeros((), device=self.device)  # read once, after the backward passes
        for rows, micro in self._micro_batches(batch):
            width = micro.mask.shape[1]
            old, target = values_old[rows, :width].to(self.device), returns[rows, :width].to(self.device)
            loss, metrics = value_loss(self._values(micro), old, target, micro.mask.to(self.device),
                                       clip_range=self.clip_value_range, normalizer=divisor[rows].to(self.device))
            self.loss_scale.scaled(loss).backward()
            share = micro.mask.sum().to(self.device) / tokens.to(self.device)
            loss_sum = loss_sum + loss.detach()
            clipped = clipped + metrics["vf_clipfrac"] * share
            predicted = predicted + metrics["vpred_mean"] * share
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        self.loss_scale.unscale(parameters)
        total = torch.nn.utils.clip_grad_norm_(parameters, self.grad_clip_norm if self.grad_clip_norm else float("inf"))
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)  # FSDP2: global already
        if not math.isfinite(float(loss_sum)):
            raise FloatingPointError("non-finite critic loss")
        lr = float(self.optimizer.param_groups[0]["lr"])  # this update's
        result = {"vf_loss": float(loss_sum), "vf_clipfrac": float(clipped), "vpred_mean": float(predicted),
                  "grad_norm": norm, "lr": lr, "overflowed": 0.0}
        if self.loss_scale.overflowed(norm):  # fp16: skipped (no step, the scale halved), not a fault
            self.optimizer.zero_grad(set_to_none=True)
            return result | {"overflowed": 1.0, "loss_scale": self.loss_scale.scale}
        if not math.isfinite(norm):
            raise FloatingPointError("non-finite critic gradient")
        self.optimizer.step()
        self.scheduler.step()
        return result | {"loss_scale": self.loss_scale.scale}

    def state_dict(self) -> dict[str, Any]:
        """The critic's weights and optimizer state (a checkpoint's), in one process's format whatever the ranks (on
        FSDP ranks gathered: a collective, rank 0's is the whole)."""
        weights = full_state(self.model, self.collective)
        return {"model": {k: v.detach().cpu().clone() for k, v in weights.items()},
                "optimizer": full_optimizer_state(self.model, self.optimizer, self.names, self.collective),
                "scheduler": self.scheduler.state_dict(), "loss_scale": self.loss_scale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_full_state(self.model, state["model"], self.collective)
        load_full_optimizer_state(self.model, self.optimizer, state["optimizer"], self.names, self.collective)
        self.scheduler.load_state_dict(state["scheduler"])
        self.loss_scale.load_state_dict(state.get("loss_scale"))
