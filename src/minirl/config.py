"""The typed configuration: one schema, loaded from YAML/TOML plus dotted ``key=value`` overrides.

A config error is the user's mistake, so it becomes one line naming the key and what is allowed
(``ConfigError``); the CLI prints it and exits with code 2. Every run writes the resolved config
(``config.yaml`` in the run directory), so a run can be repeated from its directory alone.

Batch knobs carry their unit in the name: one *global step* samples
``prompts_per_step * samples_per_prompt`` responses, splits them into ``minibatches_per_step``
(N) gradient updates, and each update accumulates gradients over micro-batches of
``micro_batch_sequences`` sequences; ``epochs_per_step`` (E) repeats the N updates over the same
mini-batches. N = E = 1 is the paper's on-policy setting; N = 2, 4, 8 its off-policy ones.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A user's configuration mistake; ``str()`` is one line naming the key (``minirl.preflight``: one per mistake)."""


class Section(BaseModel):
    # a field's docstring is its description: ``minirl config`` prints it beside the key
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        """``true`` / ``false`` given for a number is a mistake, not 1 / 0 (pydantic's lax mode would take it): it goes
        on as the text it was, which no number field takes (the error names the key and shows ``'true'``)."""
        if not isinstance(data, dict):
            return data
        return {key: str(value).lower() if isinstance(value, bool) and key in cls.model_fields
                and _numeric(cls.model_fields[key].annotation) else value for key, value in data.items()}


def _numeric(annotation: Any) -> bool:
    """A field that takes a number and not a bool (at its top level: through ``X | None`` and ``Annotated``)."""
    kinds = _kinds(annotation)
    return bool(kinds & {int, float}) and bool not in kinds


def _kinds(annotation: Any) -> set[Any]:
    args = get_args(annotation)
    if get_origin(annotation) in (Union, UnionType, Annotated):
        return set().union(*(_kinds(arg) for arg in (args[:1] if get_origin(annotation) is Annotated else args)))
    return {annotation}


class RunConfig(Section):
    name: str = "minirl"
    """Run name; the run directory is ``output_dir/name``."""
    output_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed of the run: initial weights of a preset, sampling, data order."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads (0 = leave torch's default)."""
    resume: Literal["auto", "never"] = "never"
    """``auto``: continue from the newest valid checkpoint in ``RUN_DIR/checkpoints`` if there is
    one (``minirl train --resume`` does the same); ``never``: start fresh."""
    overwrite: bool = False
    """A fresh start in a run directory that already holds a run (metrics, checkpoints) is refused
    unless this is true, so a repeated command never silently deletes a run."""


class LoRAConfig(Section):
    """LoRA adapters through ``peft`` (``minirl.models.lora``); the base weights stay frozen."""

    rank: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0)
    """Scale alpha / rank on the adapter's update (peft's ``lora_alpha``)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """peft's ``lora_dropout``; RL turns every dropout off (``minirl.trainer.disable_stochastic_layers``: pi_theta /
    pi_old is then 1 at theta_old), so it acts in the SFT cold start only."""
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    """Module names (suffixes) to adapt, as peft's ``target_modules``; names that do not exist in a
    model are skipped, but at least one must match. ``[all-linear]``: every ``nn.Linear`` but the output
    head and the routers, as peft's ``all-linear`` (TRL's and verl's usual choice). peft maps the MLP names
    (``gate_proj``, ``up_proj``, ``down_proj``, in the default) onto an MoE's fused expert tensors as well; name those
    tensors alone with ``target_parameters``."""
    target_parameters: list[str] = []
    """Parameter names (suffixes) to adapt, as peft's ``target_parameters``: an MoE's fused expert tensors, e.g.
    ``[mlp.experts.gate_up_proj, mlp.experts.down_proj]`` (Qwen3-MoE and most transformers 5 MoE families), one
    adapter per expert as peft makes them (``target_modules: []`` adapts the routed experts alone). The engine samples
    with the merged weights; the routers are not experts, so R2/R3 replay exactly. Empty: none beyond peft's own."""
    adapt_routers: bool = False
    """Allow an MoE router among ``target_modules`` (routers are not adapted by default)."""


class ModelConfig(Section):
    preset: str = "qwen3-moe-2m"
    """A built-in preset (see ``minirl.models.presets``), used when ``path`` is empty."""
    path: str | None = None
    """A local Hugging Face model directory (``from_pretrained``, no network)."""
    trust_remote_code: bool = False
    """Allow a model directory's own Python code (``auto_map``); off by default."""
    lora: LoRAConfig | None = None
    """LoRA adapters (null = full fine-tuning). Checkpoints hold the merged weights and ``adapter/``."""


class RewardFunctionConfig(Section):
    """One entry of ``task.reward_functions`` (``minirl.tasks.reward_functions``)."""

    function: str | None = Field(None, description="'module:function' (a module in the working directory or installed, "
                                 "or path/to/file.py:function)")
    model: str | None = Field(None, description="instead of a function: a local reward model directory "
                              "(AutoModelForSequenceClassification, one output), scored as TRL does")
    weight: float = Field(1.0, allow_inf_nan=False, description="the reward is the weighted sum over the functions")
    batched: bool | None = Field(None, description="called with lists, TRL-style; null: when its first parameter is 'prompts', 'completions' or 'completion_ids' (TRL) or 'data_sources' (verl)")
    name: str | None = Field(None, description="metric name reward/<name>/mean (default: the function's __name__)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="fixed keyword arguments of every call "
                                   "(verl's custom_reward_function.reward_kwargs)")
    key: str | None = Field(None, description="the entry of the function's returned dict that is this reward (verl's "
                            "algorithm.gdpo_reward_keys: one entry per key); its other numbers are logged; null: "
                            "verl's 'score' (slime's: kwargs.reward_key)")
    convention: Literal["auto", "slime", "openrlhf"] = Field(
        "auto", description="how it is called: auto (TRL's or verl's by its parameters' names, slime's when they are "
        "(args, sample), OpenRLHF's when (queries, prompts, labels)) | slime (fn(args, sample) whatever they are named; "
        "from-slime writes it) | openrlhf (fn(queries, prompts, labels), batched; from-openrlhf writes it)")

    @model_validator(mode="after")
    def _function_or_model(self) -> RewardFunctionConfig:
        if (self.function is None) == (self.model is None):
            raise ValueError("task.reward_functions: each entry names a 'function' or a reward 'model' (one of them)")
        if self.model is not None and self.key is not None:
            raise ValueError("task.reward_functions: a reward 'model' entry returns one number, it takes no 'key'")
        if self.model is not None and (self.kwargs or self.batched is False):
            raise ValueError("task.reward_functions: a reward 'model' entry takes no 'kwargs' or 'batched'")
        return self


class TaskConfig(Section):
    kind: Literal["reverse", "add", "sort", "jsonl"] = "reverse"
    """reverse | add | sort (synthetic, with teachers for SFT) | jsonl (your data file, see ``path``)."""
    difficulty: int = Field(6, ge=1)
    """Synthetic tasks: input length (letters to reverse/sort, digits to add)."""
    num_train_prompts: int = Field(2000, ge=1)
    """Synthetic tasks: training prompts generated."""
    num_eval_prompts: int = Field(64, ge=1)
    """Synthetic tasks: held-out prompts generated."""
    seed: int = 1234
    """Seed of the synthetic data (separate from ``run.seed``)."""
    path: str | list[str] | None = None
    """Data task (kind jsonl): training data, a .jsonl, .json or .parquet file or a dataset directory, with a prompt
    and an answer column; other columns pass through. A list: their rows one after another (verl's list of
    ``data.train_files``; a ``data_source`` column tells their rows apart)."""
    eval_path: str | list[str] | None = None
    """Data task: separate held-out data, a file or directory or a list of them (else ``eval_fraction`` of ``path``)."""
    eval_fraction: float = Field(0.1, gt=0, lt=1)
    """Data task without ``eval_path``: fraction of rows held out (seeded by ``task.seed``)."""
    dataset_config: str | None = None
    """A dataset repository directory's config (subset), as ``load_dataset(path, name)`` reads it (TRL's
    ``dataset_config``, e.g. gsm8k's ``main``); null: its only or default one."""
    train_split: str = "train"
    """The split of a dataset directory ``path`` to train on (TRL's ``dataset_train_split``)."""
    eval_split: str | None = None
    """Held-out prompts from this split of ``eval_path`` or, without one, of ``path`` (TRL's ``dataset_test_split``);
    null: ``eval_path`` whole, or ``eval_fraction`` of the training rows."""
    reward: Literal["exact", "math_verify"] = "exact"
    """Built-in verifier of a data task: exact (string match) or math_verify (mathematical equality)."""
    reward_function: str | None = None
    """A user reward ``package.module:function`` (or ``path/file.py:function``) called as ``fn(prompt,
    completion, answer) -> float``; verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info)`` works as it is, and a bare ``path/file.py`` names its ``compute_score``."""
    reward_functions: list[RewardFunctionConfig] = []
    """Several weighted user rewards, per-sample or batched (TRL's signature), sync or async; every
    extra data column reaches them as a keyword (``minirl.tasks.reward_functions``)."""
    reward_timeout_s: float | None = Field(10.0, gt=0)
    """Seconds one call of ``reward_function`` may take (it runs in a worker process that is killed
    past it); null = no timeout, called in the trainer's process. Built-in verifiers never time out, nor do reward
    models and functions reading the rollouts' environments (TRL's ``environments=``), which run in the trainer's
    process."""
    reward_on_error: Literal["fail", "fallback"] = "fail"
    """A reward function that raises, returns a non-finite/non-number or times out: stop the run
    (fail) or give the sample ``reward_fallback`` and count it in ``reward/*`` (fallback)."""
    reward_fallback: float = Field(0.0, allow_inf_nan=False)
    """The reward a failing sample gets with ``reward_on_error=fallback``."""
    reward_workers: int = Field(1, ge=1)
    """Worker processes running ``reward_function`` in parallel (with a timeout)."""
    prompt_column: str = "prompt"
    """Data column holding the prompt: a string, or a chat (TRL's ``[{"role": ..., "content": ...}]``)."""
    answer_column: str = "answer"
    """Data column holding the reference answer (optional when user reward functions are given, unless named
    here: a column other than ``answer`` must be in every row, as slime's ``--label-key``); a dotted name reads a field of an object
    column. A verl data file needs none: without an ``answer`` column
    the default reads verl's ``reward_model.ground_truth``."""
    system_prompt: str | None = None
    """Data task: a system message before every prompt, a text prompt becoming the chat [system, user] and a chat
    prompt without a system message getting it first (open-r1's GRPO ``system_prompt``); null: none."""
    chat_prompts: bool = False
    """Data task: a text prompt becomes a user message, rendered with the chat template (open-r1's
    ``make_conversation``; ``cold_start.chat_prompts`` for SFT data). False: TRL's rule, a text prompt is plain text."""
    chat_template: str = "auto"
    """Chat prompts: ``auto`` = the tokenizer's chat template (``add_generation_prompt=True``);
    ``plain`` = their contents as plain text; else a Jinja template file to use (and save) instead."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra variables of every chat-template rendering (prompts, SFT, a reward model's): TRL's
    ``chat_template_kwargs``, verl's ``data.apply_chat_template_kwargs``; e.g. ``{enable_thinking: false}`` for Qwen3."""
    stop_strings: list[str] = []
    """A completion also ends after the token that completes one of these (besides the tokenizer's
    EOS and the model's ``generation_config.eos_token_id``, which always stop it)."""
    tools: list[str] = []
    """Functions the model may call while it answers (TRL's ``GRPOTrainer(tools=[...])``), each a
    ``package.module:function`` or ``path/file.py:function``; their schemas (from the signature and docstring, as
    ``apply_chat_template(tools=...)`` reads them) go into every chat prompt, a call the model writes is run and its
    result appended to the response, and the model goes on; the results train nothing (``minirl.rollout.tools``).
    verl's ``@function_tool`` functions run as verl runs them (``minirl.rollout.verl_tools``). Needs chat prompts and
    a template that renders tool calls."""
    environment: str | dict[str, str] | None = None
    """An environment each rollout acts in (TRL's ``GRPOTrainer(environment_factory=...)``): ``module:Class`` whose
    instance is reset with the row before the rollout (its text, if any, appended to the prompt), whose public
    methods are tools, and whose ``get_reward()``, if any, is the rollout's reward beside ``task.reward_functions``;
    ``{name: module:Class}``: each row's ``environment`` column picks one (``minirl.rollout.environments``)."""
    tool_config: str | None = None
    """verl's tool config (the YAML file of ``multi_turn.tool_config_path``): its ``BaseTool`` classes are the model's
    tools, each call run as verl's tool agent runs it (``create`` with the row's ``extra_info.tools_kwargs``,
    ``execute``, ``release``), their step rewards reaching reward functions in ``extra_info["tool_rewards"]``
    (``minirl.rollout.verl_tools``); null: none."""
    max_tool_iterations: int | None = Field(None, ge=1)
    """``task.tools``: rounds of tool calls per response at most (TRL's ``max_tool_calling_iterations``, verl's
    ``multi_turn.max_assistant_turns`` less one); null: until the model stops calling or ``rollout.max_new_tokens``,
    which counts the results' tokens too, is spent."""
    max_tool_calls_per_turn: int | None = Field(None, ge=1)
    """``task.tools`` / ``task.environment``: calls run from one turn at most, the first ones (verl's
    ``multi_turn.max_parallel_calls``, 1 there by default); null: all of them, as in TRL."""
    tool_timeout_s: float | None = Field(None, gt=0)
    """``task.tools`` / ``task.environment``: seconds one call may run; past it the call's result is an error and the
    model goes on (its thread is left to finish: Python cannot stop it). With a limit each sync call runs in a thread
    of its own (a tool holding thread-bound state, e.g. a sqlite connection, needs null). null (or .inf): as long as it
    takes, as in TRL."""
    tool_result_max_chars: int | None = Field(None, ge=1)
    """``task.tools`` / ``task.environment``: a tool's result longer than this many characters is cut before it joins
    the response (verl's ``multi_turn.max_tool_response_length``, 256 there by default); null: kept whole, as in TRL."""
    tool_result_keep: Literal["head", "tail", "middle"] = "middle"
    """What a cut result keeps: its first characters and ``...(truncated)`` (verl 0.9's ``tool_response_truncate_side:
    right``: the right side is cut; verl before 0.9 read ``left`` so), ``(truncated)...`` and its last (verl 0.9's
    ``left``), or both halves around ``...(truncated)...`` (``middle``, verl's default)."""
    tool_parser: Literal["hermes", "tokenizer"] = "hermes"
    """``task.tools``: how a call is read from the model's turn: ``hermes`` = ``<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>`` blocks (Qwen2.5/3, Hermes; verl's default format); ``tokenizer`` = the tokenizer's own
    ``parse_response`` (transformers' response schema, as TRL reads calls)."""
    on_bad_row: Literal["error", "skip"] = "error"
    """JSONL: a malformed or too long row stops the load (error) or is skipped and counted (skip)."""
    max_prompt_chars: int | None = Field(None, ge=1)
    """JSONL: a row whose prompt is longer than this many characters is a bad row."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """JSONL: a row whose prompt encodes to more tokens is a bad row (verl's ``data.max_prompt_length``; with
    ``on_bad_row: skip``, its ``filter_overlong_prompts``), unless ``task.prompt_truncation`` cuts it. The model's
    context less ``rollout.max_new_tokens`` always bounds it."""
    prompt_truncation: Literal["none", "left", "right", "middle"] = "none"
    """A prompt longer than ``task.max_prompt_tokens`` and the model's context less ``rollout.max_new_tokens``
    allow: ``none`` = a bad row (``task.on_bad_row``); ``left`` = keep its last tokens (TRL's ``max_prompt_length``;
    verl's ``data.truncation: left``, which verl 0.9's agent loop applies whatever that key says); ``right`` = keep its
    first; ``middle`` = its first n // 2 and its last n - n // 2 tokens (verl's ``middle``). The cut is of the
    token ids after the chat template, so the engine, the trainer and SFT's task prompts see the same ids; reward
    functions still get the whole prompt."""

    @model_validator(mode="after")
    def _jsonl_needs_path(self) -> TaskConfig:
        if self.kind == "jsonl" and not self.path:
            raise ValueError("task.path: required when task.kind is 'jsonl' (a JSONL file with prompt/answer)")
        if self.reward_function and self.reward_functions:
            raise ValueError("task.reward_functions: give either task.reward_function (one) or task.reward_functions (a list)")
        if self.environment == {}:
            raise ValueError("task.environment: an empty mapping names no environment (null: none)")
        return self

    @property
    def calls_tools(self) -> bool:
        """Responses are sampled in turns with tool calls (``task.tools``, ``task.environment`` or
        ``task.tool_config``)."""
        return bool(self.tools or self.environment or self.tool_config)

    @property
    def tools_key(self) -> str:
        """The first key that asks for tool calls (``task.tools``, ``task.environment``, ``task.tool_config``), for
        an error line to name."""
        return next((f"task.{name}" for name in ("tools", "environment", "tool_config") if getattr(self, name)),
                    "task.tools")


class RolloutConfig(Section):
    prompts_per_step: int = Field(8, ge=1)
    """P: prompts sampled per global step."""
    samples_per_prompt: int = Field(8, ge=1)
    """Group size G of the group-mean baseline (>= 2; 1 only with a baseline that needs no group: ``algo.adv_baseline``
    none, critic or greedy, as verl's and OpenRLHF's PPO and REINFORCE++ sample one response a prompt)."""
    max_new_tokens: int = Field(32, ge=1)
    """Most tokens generated per completion."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the rollout engine."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass of the rollout engine (1 = off)."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most probable tokens (0 = off); ``logp_rollout`` is of that truncated law."""
    min_p: float = Field(0.0, ge=0, lt=1)
    """Drop tokens less probable than min_p x the most probable one (0 = off; vLLM's order: min-p, top-k, top-p)."""
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)
    """CTRL's repetition penalty on the raw logits, before the temperature (TRL's and verl's ``repetition_penalty``,
    as Hugging Face and vLLM apply it): a token already in the row's prompt or completion has its logit divided by
    this where positive, multiplied where not (1 = off). ``logp_rollout`` is of the penalised law, so the
    importance weight sees the gap it opens between engine and trainer (``mismatch/*``)."""
    precision: Literal["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"] = "fp32"
    """The engine's own weight precision: the controlled training–inference mismatch, from none
    (fp32) to fp4 (``minirl.rollout.precision``)."""
    fp8_scale: Literal["per_tensor", "per_expert"] = "per_tensor"
    """fp8 weight scales: one per tensor, or one per expert slice of a 3-D expert tensor."""
    fp4_block_size: int = Field(32, gt=0)
    """fp4_e2m1: consecutive values along a weight's input dimension sharing one scale (MXFP4 /
    NVFP4 blocks); must divide every quantised weight's input dimension (checked with the model)."""
    kv_cache_precision: Literal["same", "fp8_e4m3", "fp8_e5m2"] = "same"
    """The engine's KV cache: ``same`` = the compute dtype; fp8 = keys and values rounded to fp8
    with one scale per token and KV head as they are written (``minirl.rollout.kv_cache``)."""
    filter_groups: bool = False
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``): a group whose rewards are all equal has zero
    advantage, so no gradient; drop it and sample more rounds of prompts until ``prompts_per_step`` groups with a
    spread remain (a round's surplus is dropped). The update and ``train/*`` see the kept groups; ``filter/*``
    what was generated (``filter/reward_mean_generated`` is the unfiltered reward). Off: the paper's setting."""
    filter_groups_metric: Literal["reward", "accuracy"] = "reward"
    """What must differ within a kept group: the reward (verl's ``score`` / ``seq_reward``), or correctness,
    reward >= ``eval.accuracy_threshold`` (verl's ``acc``; differs from ``reward`` under length shaping)."""
    filter_groups_max_rounds: int = Field(10, ge=0)
    """Rounds of generation per global step at most (verl's ``max_num_gen_batches``; 0 = up to one pass over the
    training prompts). A batch still short after them is filled with the zero-spread groups drawn first (no
    gradient, as without filtering), counted by ``filter/topped_up_groups``; verl stops with an error instead."""
    filter_groups_prompts_per_round: int = Field(0, ge=0)
    """Prompts drawn per round (verl's ``data.gen_batch_size``; 0 = ``prompts_per_step``)."""
    async_steps: int = Field(0, ge=0, le=64)
    """Asynchronous RL, k steps off (0 = synchronous, the paper's setting; 1 = verl's ``one_step_off_policy``; k > 1 =
    prime-rl's ``async_level`` as a fixed lag): step t+k's rollout and rewards run in a thread beside step t's update,
    on the weights before it. The rollout's time hides behind the update's, and every batch after the first k is k
    steps stale (k = 1: mu_old is theta_{t-1}, pi_old theta_t; the IS weight and the clip mask see the gap; R3 replays
    the stale engine's routes); the first step starts steps 2..k+1, lags 1..k. ``rollout/policy_lag_steps`` gives
    each batch's lag (``minirl.async_rollout``). TRL's ``AsyncGRPOTrainer`` is 1 here. With one engine k > 1 is a
    staleness knob, no faster than 1. On a CPU, ``run.threads`` = half the cores gives each side its own."""
    async_split_mismatch: bool = False
    """With ``async_steps: 1``: also score each batch at the weights that sampled it (theta_{t-1}; a kept copy of the
    trainable weights, one more no-grad pass per step), so that ``mismatch/*`` (mu_old against pi_old, what the IS
    weight sees) splits into ``mismatch/engine_*`` (the engine against the trainer at the same weights: the
    training–inference discrepancy) and ``mismatch/lag_*`` (pi at theta_{t-1} against pi_old: the policy staleness
    of the lag), the paper's two gaps (``minirl.async_rollout.EngineWeights``). A checkpoint keeps the copy, so the
    first step after a resume splits too."""
    partial_rollout: bool = False
    """Responses that outlive a weight sync (slime's ``--partial-rollout``, verl's fully asynchronous
    ``partial_rollout``, Kimi k1.5's partial rollouts): each step decodes its pool of groups (batches of
    ``partial_pool_prompts`` prompts, over-sampled), checks every ``partial_chunk_tokens`` tokens and stops once
    ``prompts_per_step`` groups have ended (with ``filter_groups``: with a spread); it trains on those (others ended
    by the same check are dropped, as in slime), and the groups still running wait in the pool, their unfinished
    responses continued next step on the new weights. A response then holds
    tokens of several policy versions, each with the log-prob of the law that sampled it; ``rollout/stale_tokens_frac``
    counts them (``minirl.partial_rollout``). With ``async_steps`` the pool is sampled beside the update (verl's fully
    asynchronous ``partial_rollout``). Off: every response is sampled whole by one policy, the paper's setting."""
    partial_pool_prompts: int | None = Field(None, ge=1)
    """Prompts drawn at a time under ``partial_rollout``, whenever the groups running and ended fall short of
    ``prompts_per_step`` (slime's ``--over-sampling-batch-size``): at least ``prompts_per_step``; null = twice it. At
    ``prompts_per_step`` responses carry over only when ``filter_groups`` drops groups mid-step (slime's default); the
    more over-sampling, the more responses wait for a later step (``rollout/stale_tokens_frac``)."""
    partial_chunk_tokens: int = Field(64, ge=1)
    """Under ``partial_rollout``: new tokens per response between two checks of how many groups have ended. The
    native engine checks inside one call, its KV cache kept (CUDA graphs, several in this process too); vLLM and Ray engines
    decode a chunk per call, each prefilling prompt and response so far again (vLLM from its prefix cache, which holds
    what the step's earlier chunks computed), so there a larger chunk costs less."""
    partial_mask_stale: bool = False
    """Under ``partial_rollout``: train only the tokens sampled for the current step's batch (by the step's weights,
    or with ``async_steps`` the weights before it); a response's older tokens stay in its context but get no loss
    (slime's ``--mask-offpolicy-in-partial-rollout``)."""
    cuda_graphs: bool = False
    """CUDA only: decode by batch-size bucket over a static KV cache, each bucket's step captured in a
    CUDA graph (``minirl.rollout.graph_decode``); false = the dynamic decode loop. No effect on a CPU.
    With fp8/fp4 weights the engine then computes in bf16 (the experts' grouped GEMM dtype)."""


class OptimConfig(Section):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # every value finite

    global_steps: int = Field(100, ge=0)
    """Global steps (each = 1 rollout + N gradient updates + 1 weight sync)."""
    minibatches_per_step: int = Field(1, ge=1)
    """N: gradient updates per global step (1 = on-policy)."""
    epochs_per_step: int = Field(1, ge=1)
    """E: passes over each global step's N mini-batches, in the same order (verl's ``ppo_epochs``, TRL's
    ``num_iterations``): N x E updates per rollout, all against the same pi_old and mu_old, so every update after
    the first is off-policy (E = 1: the paper's setting)."""
    micro_batch_sequences: int = Field(64, ge=1)
    """Sequences per forward/backward; gradients accumulate over a mini-batch."""
    micro_batch_max_tokens: int | None = Field(None, ge=1)
    """Dynamic micro-batches (verl's ``use_dynamic_bsz`` + ``ppo_max_token_len_per_gpu``, slime's
    ``--max-tokens-per-gpu``): rows sorted by length and cut so that each forward/backward holds at
    most this many padded tokens (and ``micro_batch_sequences`` rows); a longer row goes alone.
    Skips the padding of one right-padded batch and bounds activation memory; the gradient is the
    same sum (to float rounding). ``null``: fixed micro-batches of ``micro_batch_sequences`` rows."""
    lr: float = Field(1e-4, ge=0, le=1)
    """AdamW's learning rate (finite; above 1 every update would move each weight by more than 1)."""
    warmup_updates: int = Field(0, ge=0)
    """Linear learning-rate warm-up, in gradient updates (N x E per global step)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """After the warm-up: constant (the paper's), or a decay to ``min_lr_ratio`` x lr at the last of the
    global_steps x N x E updates, linear (TRL's default ``lr_scheduler_type``) or half a cosine (transformers' and
    verl's ``cosine``); ``minirl.trainer.lr_factor``."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Where ``linear`` / ``cosine`` end, as a fraction of ``lr`` (verl's ``min_lr_ratio``; 0 = transformers')."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW beta2."""
    adam_eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    adamw_impl: Literal["default", "for_loop", "foreach", "fused"] = "default"
    """How ``torch.optim.AdamW`` runs its step (the same update to float rounding): ``default`` = torch's choice
    (foreach on CUDA, the for-loop on a CPU); ``for_loop`` / ``foreach`` / ``fused`` force one. ``fused`` (one
    kernel per parameter; transformers' ``optim: adamw_torch_fused``, TRL's default) is 4x faster on a CPU."""
    grad_clip_norm: float = Field(1.0, gt=0)
    """Gradient norm clipping threshold."""
    max_consecutive_faults: int = Field(3, ge=1)
    """A non-finite log-prob, loss or gradient, or an optimizer step leaving non-finite or exploding
    weights (undone, ``minirl.update_guard``), skips that update; this many skipped updates in a
    row stop the run (exit code 3), keeping the last good checkpoint."""
    update_guard: Literal["undo", "check", "off"] = "undo"
    """After every optimizer step, one fused norm checks the weights are finite and did not explode
    (``minirl.update_guard``). ``undo``: a copy of weights and AdamW state taken before the step puts
    a poisoned step back (skipped and counted like a non-finite gradient; costs one more copy of
    weights + optimizer state in memory); ``check``: no copy, a poisoned step stops the run at once
    (exit 3) before any checkpoint holds it — for models whose copy does not fit; ``off``: no check."""
    padding_free: bool = False
    """Every trainer forward (the update's, pi_old's, the reference's, the critic's) on the real tokens only: the rows packed
    into one [1, T] row with their own positions, attention run per row (verl's ``use_remove_padding``, TRL's
    ``padding_free``; ``minirl.models.padding_free``). Log-probs as the padded forward's, gradients to float
    rounding; ``micro_batch_max_tokens`` then counts real tokens. Needs attention ``sdpa`` or ``flash_attention_*``."""
    shared_prompt: bool = False
    """Each prompt once per micro-batch in every trainer forward (the critic's too): rows with the same prompt tokens (under routing
    replay also the same prompt routes) pack it once and read its keys and values in attention, so projections,
    experts, norms and the head run on P + G R tokens of a group instead of G (P + R), and under sdpa attention asks
    only at each row's own tokens (verl's ``use_prefix_grouper``,
    NeMo RL's ``shared_prefix_training``; ``minirl.models.padding_free``). Runs the padding-free forward (implies
    ``padding_free``); log-probs as the padded forward's, gradients to float rounding. The router load-balancing loss
    counts a shared prompt's tokens once. Rows of a group share only within a micro-batch; ``micro_batch_max_tokens``
    then keeps a prompt's rows together and counts the prompt once."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations during backward instead of keeping them (less
    memory, about one more forward); routing replay replays the same routes in the recomputation."""
    logprob_chunk_tokens: int | None = Field(None, ge=1)
    """The LM head and log-softmax on the completion tokens only, this many at a time, each chunk's logits
    recomputed in the backward (verl's ``use_fused_kernels``, TRL's ``use_liger_kernel``): the [tokens, vocabulary]
    logits never exist whole, the largest tensors of an update with a big vocabulary (``minirl.models.logprob_head``).
    Log-probs and entropies as the whole-tensor path's, to float rounding. null = the model's own forward."""
    score_at_rollout_temperature: bool = True
    """The trainer's log-probs (pi_theta, pi_old, the reference's) and entropies are of logits / rollout.temperature,
    the law the engine samples before its truncations, as TRL, verl and slime compute them, so ``mismatch/*`` and the
    IS weight see the engine's gap, not the temperature. false: of the raw logits (the policy at temperature 1; the
    IS weight pi_theta/mu_old, truncated, then also carries the temperature). No effect at rollout.temperature 1."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """The trainer's compute: fp32, or bf16 / fp16 mixed precision (autocast; float32 master weights,
    gradients and AdamW state; FSDP2 ranks all-gather in that dtype and reduce in fp32). ``minirl.precision``.
    fp16 (TRL's ``fp16``, slime's ``--fp16``; the FP16 paper's fix for the training-inference mismatch, against an
    fp16 engine) scales the loss dynamically as torch AMP's ``GradScaler`` does: an update whose gradient overflows
    is skipped and the scale halved (``faults/fp16_overflows``, ``optim/loss_scale``), not counted as a fault.
    bf16 and fp16 are slow on CPUs without native half-precision matmuls (``cpu_native_half_gemm`` in
    environment.jsonl)."""
    loss_scale_initial: float = Field(65536.0, gt=0, allow_inf_nan=False)
    """fp16 only: the loss scale the run starts at (torch AMP ``GradScaler``'s ``init_scale`` 2^16, TRL's; Megatron-LM's
    ``--initial-loss-scale`` 2^32, slime's; DeepSpeed's 2^``initial_scale_power``)."""
    loss_scale_window_updates: int = Field(2000, ge=1)
    """fp16 only: the scale doubles after this many updates in a row without an overflow (``GradScaler``'s
    ``growth_interval`` 2000; verl's FSDP actor 400; Megatron-LM's ``--loss-scale-window`` and DeepSpeed's
    ``loss_scale_window`` 1000)."""
    loss_scale_min: float = Field(1.0, gt=0, allow_inf_nan=False)
    """fp16 only: the scale is never halved below this (Megatron-LM's ``--min-loss-scale``, DeepSpeed's
    ``min_loss_scale``, both 1); a non-finite gradient at this scale is a numerical fault, not an overflow."""
    loss_scale_hysteresis: int = Field(1, ge=1)
    """fp16 only: how many overflows (each skips its update) since the scale last grew before it is halved: 1 halves at
    every overflow (``GradScaler``); Megatron-LM's ``--hysteresis`` and DeepSpeed's ``hysteresis`` are 2."""
    allow_tf32: bool = False
    """CUDA: run float32 matmuls on TF32 tensor cores (faster, inexact). No effect on a CPU."""
    cpu_offload: bool = False
    """The trainer's parameters, gradients and AdamW state live in CPU memory (FSDP2's ``CPUOffloadPolicy``; verl's
    ``fsdp_config.offload_policy``, DeepSpeed's ZeRO offload): each decoder layer's parameters are copied to the device
    for its forward and backward, and AdamW steps on the CPU. The model then needs about one layer's weights and the
    activations on the GPU, at the cost of host-device copies and a CPU optimizer step in every update (set
    ``adamw_impl: fused``: torch's default on CPU tensors is its for-loop). Runs the trainer as FSDP ranks even at
    ``cluster.trainer_ranks`` 1. The same updates to float rounding (bitwise on a CPU, where there is nothing to move)."""

    @model_validator(mode="after")
    def _loss_scale_floor(self) -> Any:
        if self.loss_scale_min > self.loss_scale_initial:
            raise ValueError(f"loss_scale_min ({self.loss_scale_min}) must not exceed loss_scale_initial "
                             f"({self.loss_scale_initial})")
        return self

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        for old, new in RENAMED_OPTIM.items():
            if isinstance(data, dict) and old in data:
                raise ValueError(f"optim.{old}: renamed to optim.{new} (units in the name: {RENAMED_OPTIM_UNITS[new]})")
        return data


RENAMED_OPTIM = {"steps": "global_steps", "warmup_steps": "warmup_updates"}
RENAMED_OPTIM_UNITS = {"global_steps": "rollout + N updates + weight sync each", "warmup_updates": "gradient updates"}


TisFloor = Annotated[float, Field(ge=0, description=(
    "Lower bound of the IS weight: tis_mode truncate raises a smaller weight to it (TRL's "
    "vllm_importance_sampling_clip_min), mask zeroes it (IcePop's lower bound, verl's 'lower_upper'); 0 = none."))]
TisMode = Annotated[Literal["truncate", "mask"], Field(description=(
    "How tis_cap (and tis_floor) bound the IS weight: truncate = min(w, tis_cap) (TIS, the paper's); mask = w kept "
    "inside [tis_floor, tis_cap], 0 outside (IcePop; TRL's token_mask / sequence_mask)."))]
TisLevel = Annotated[Literal["token", "sequence"], Field(description=(
    "token = one IS weight per token, the paper's (its equation 4); sequence = the product of the response's token "
    "ratios, bounded and given to all its tokens (equation 2's weight; TRL's sequence_* modes, verl's "
    "rollout_is=sequence)."))]

OpsmThreshold = Annotated[float | None, Field(allow_inf_nan=False, description=(
    "Off-policy sequence masking (DeepSeek-V3.2; TRL's off_policy_mask_threshold, slime's --use-opsm): a response "
    "with A < 0 whose mean log(mu_old/pi_theta) over its tokens exceeds this trains no token; null = off (the paper's)."))]

DualClip = Annotated[float | None, Field(gt=1, allow_inf_nan=False, description=(
    "PPO's dual clip c (> 1; verl's clip_ratio_c, 3 by default there; TRL's delta): tokens with A < 0 and "
    "pi_theta/pi_old > c get no gradient; null = off (the paper's)."))]


def _check_tis_bounds(section: Any) -> Any:
    if section.tis_floor >= section.tis_cap:
        raise ValueError(f"tis_floor ({section.tis_floor}) must be below tis_cap ({section.tis_cap})")
    return section


class LossConfig(Section):
    """Fields shared by every objective; each variant adds only its own knobs."""

    adv_std_normalize: bool = False
    """Divide the group-centred reward by the group's std (+1e-6), as GRPO does."""
    adv_std_eps: float = Field(1e-6, gt=0)
    """What the std is increased by before dividing (``adv_std_normalize``, GDPO's normalisations): 1e-6 as verl and
    slime (the paper's GRPO), 1e-4 TRL's, 1e-9 OpenRLHF's ``group_norm``."""
    adv_std_scope: Literal["group", "batch"] = "group"
    """Whose std adv_std_normalize divides by: each group's (GRPO), or all the step's rewards' (TRL's
    ``scale_rewards="batch"``)."""
    adv_baseline: Literal["group_mean", "leave_one_out", "length_weighted", "none", "pass_at_k", "greedy",
                          "critic", "optimal_token"] = "group_mean"
    """What each reward is less: the group mean (the paper's); the mean of the other G - 1 rewards (RLOO; verl's
    ``adv_estimator=rloo``); the group's mean weighted by response length (OPO, arXiv 2505.23585; verl's ``opo``);
    nothing (REINFORCE++ with ``adv_whiten``; verl's ``reinforce_plus_plus``); ``pass_at_k``: only each group's best
    response keeps an advantage, its lead over the second best (arXiv 2503.19595; verl's ``grpo_passk``); or
    ``greedy``: the reward of one greedy completion of the prompt, sampled each step beside the group (ReMax, arXiv
    2310.10505; verl's ``remax``; ``train/greedy_reward_mean``); or ``critic``: a learned value per token, PPO's
    generalized advantage estimation with ``adv_gamma`` and ``adv_lambda`` (verl's default ``gae``; the ``critic``
    section; ``minirl.algo.variants.gae``); or ``optimal_token``: one baseline per token position, the group's returns
    weighted by each path's accumulated 1 - 2 pi_old + sum pi_old^2 (verl's ``optimal_token_baseline``, arXiv
    2602.07078; ``minirl.algo.variants.otb``; the old-log-prob pass also gives sum pi_old^2)."""
    adv_whiten_over: Literal["tokens", "responses"] = "tokens"
    """What ``adv_whiten`` weighs: each response by its tokens (verl's ``masked_whiten``, 1e-8 inside the root), or
    each response once ((A - mean) / (std + 1e-4): TRL's ``RLOOTrainer`` with ``normalize_advantages``)."""
    adv_token_returns: bool = False
    """One advantage per token instead of per response: each token's return, the response's reward at its last token
    less the KL in the reward (``kl_in_reward_coef``) at every token, summed from that token on with ``adv_gamma``
    (verl's ``reinforce_plus_plus`` and ``remax``; ``minirl.algo.variants.token_returns``), then less the greedy reward
    (``adv_baseline: greedy``) or whitened over tokens (``adv_whiten``). Needs ``adv_baseline`` none or greedy, no
    group std, a token-level loss (not gspo) and no OPSM. Off: the paper's one advantage per response."""
    adv_gamma: float = Field(1.0, ge=0, le=1)
    """The discount of ``adv_token_returns`` and of the critic's GAE (verl's ``algorithm.gamma``); 1 = none."""
    adv_lambda: float = Field(1.0, ge=0, le=1)
    """GAE's lambda (``adv_baseline: critic``; verl's ``algorithm.lam``): 1 = the return less the value, 0 = the
    one-step TD error."""
    adv_token_kl: bool = False
    """One advantage per token: its response's advantage (from the unpenalised rewards) less ``kl_in_reward_coef`` x
    *that token's* KL estimate, then whitened over tokens (``adv_whiten``): slime's ``reinforce_plus_plus_baseline``
    with ``--kl-coef`` (``get_reinforce_plus_plus_baseline_advantages``). Off: the KL in the reward is each response's
    summed estimate (verl's ``use_kl_in_reward``), or in each token's return (``adv_token_returns``)."""
    reward_clip_range: tuple[float, float] | None = None
    """Clamp each response's (weighted-sum) reward into [low, high] before the KL in the reward and the advantages
    (TRL's ``RLOOTrainer`` ``reward_clip_range``); the reward metrics stay unclipped. ``null``: no clamp, the paper's."""
    adv_nonzero_rescale: bool = False
    """Then multiply the advantages by the step's responses over those with a non-zero reward (GPG's alpha, arXiv
    2504.02546; verl's ``adv_estimator=gpg``). Off: the paper's."""
    adv_whiten: bool = False
    """Then whiten the advantages over the step's tokens (token-weighted mean and std: REINFORCE++-baseline, verl's
    ``adv_estimator=reinforce_plus_plus_baseline``). Off: the paper's."""
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """With several reward functions (``task.reward_functions``): ``sum_then_normalize`` forms the advantage from
    their weighted sum, as from one reward (the paper's); ``normalize_then_sum`` is GDPO's (arXiv 2601.05242; TRL's
    ``multi_objective_aggregation``): each function normalised within its group, the weighted sum whitened over the
    step's responses (``minirl.algo.variants.gdpo.decoupled_advantages``; ``adv_std_normalize`` is then not used), or
    over its tokens with ``adv_whiten`` (verl's ``gdpo``, its ``masked_whiten``)."""
    kl_coef: float = Field(0.0, ge=0)
    """KL penalty to a frozen reference policy (``minirl.algo.variants.reference_kl``; verl ``kl_loss_coef``,
    TRL ``beta``). 0 = none, as in the paper. With LoRA the reference is the base model."""
    kl_loss_type: Literal["k1", "k2", "k3"] = "k3"
    """Per-token KL estimator: k1 (verl "kl"), k2 ("mse"), k3 ("low_var_kl", Schulman's k3)."""
    kl_loss_unbiased: bool = False
    """Weigh each token's KL estimate by pi_theta/pi_old, the gradient flowing through the ratio too (slime's
    ``--use-unbiased-kl``, DeepSeek-V3.2's KL for samples of an older policy). false: the estimate alone."""
    ref_sync_every_updates: int | None = Field(None, ge=1)
    """Move the reference toward the policy every this many optimizer steps: pi_ref <- alpha pi_theta + (1 - alpha)
    pi_ref (TR-DPO, arXiv 2404.09656; TRL's ``sync_ref_model`` with ``ref_model_sync_steps``). ``null``: the
    reference stays the starting policy. Needs ``kl_coef`` > 0 and no LoRA; the reference is checkpointed."""
    ref_sync_alpha: float = Field(0.6, ge=0, le=1)
    """The mix of each reference sync (TRL's ``ref_model_mixup_alpha``): 1 copies the policy."""
    kl_in_reward_coef: float = Field(0.0, ge=0)
    """KL penalty in the reward (verl's ``use_kl_in_reward`` with ``kl_ctrl.kl_coef``): each response's reward less
    this x its summed KL estimate of pi_old against the reference, before the advantages
    (``minirl.algo.variants.kl_reward``). 0 = none, as in the paper. Not with ``normalize_then_sum``."""
    kl_in_reward_type: Literal["k1", "k2", "k3"] = "k1"
    """Its per-token estimator (verl's ``algorithm.kl_penalty``: kl = k1, its default; mse = k2; low_var_kl = k3)."""
    kl_in_reward_target: float | None = Field(None, gt=0)
    """Adapt the coefficient toward this KL per step (verl's ``kl_ctrl.type: adaptive`` with ``target_kl``; Ziegler et
    al. 2019); ``null``: fixed."""
    kl_in_reward_horizon: int = Field(10000, ge=1)
    """The adaptive controller's horizon, in responses (verl's ``kl_ctrl.horizon``)."""
    top_entropy_quantile: float = Field(1.0, gt=0, le=1)
    """Train the policy term on the top this fraction of each micro-batch's tokens by pi_theta's entropy ("Beyond
    the 80/20 rule", arXiv 2506.01939, recommends 0.2; TRL's ``top_entropy_quantile``); the others still count in
    the loss's denominators. The quantile is each micro-batch's (on FSDP ranks each rank's share of it, so W ranks
    select otherwise than one process). 1 = every token, the paper's. Not for gspo (no per-token terms)."""
    router_aux_loss_coef: float = Field(0.0, ge=0)
    """MoE load-balancing loss (Switch Transformer's, ``minirl.moe.balance``) added to the loss with this weight, over
    each micro-batch's real tokens (TRL's ``router_aux_loss_coef``, on by default there with the model config's
    coefficient). 0 = none, as in the paper's RL. Needs a model that returns its router logits."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: minus this x pi_theta's token-mean full-vocabulary entropy, added to the loss
    (``minirl.algo.variants.entropy``; verl ``entropy_coeff``, TRL ``entropy_coef``). 0 = none, as in the paper."""
    entropy_target: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Adaptive entropy control (Skywork-OR1, arXiv 2505.22312; TRL's ``use_adaptive_entropy``): after each update the
    coefficient rises by ``entropy_coef_delta`` when pi_theta's token-mean entropy was <= this target (nats), else
    falls by it, within [``entropy_coef_min``, ``entropy_coef_max``], starting from ``entropy_coef``; an update applies
    it only when the last update's entropy was <= the target (not the first). ``null``: ``entropy_coef`` is fixed."""
    entropy_coef_min: float = Field(0.0, ge=0)
    """Adaptive entropy control: the lowest coefficient (TRL's ``entropy_coef_min``)."""
    entropy_coef_max: float = Field(1.0, ge=0)
    """Adaptive entropy control: the highest coefficient (TRL's ``entropy_coef_max``)."""
    entropy_coef_delta: float = Field(0.005, ge=0)
    """Adaptive entropy control: the step of the coefficient per update (TRL's ``entropy_coef_delta``)."""
    mask_truncated: bool = False
    """Leave completions cut by max_new_tokens out of the loss (TRL's ``mask_truncated_completions``, DAPO's
    overlong filtering); their rewards still count in their group's baseline. Off: the paper's setting."""
    reject: Literal["none", "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
                    "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"] = "none"
    """Leave out of the loss tokens (token_*) or whole responses (seq_*) whose training–inference divergence,
    from rho = pi_old/mu_old, is out of bounds (verl's ``rollout_rs``; ``minirl.algo.variants.rejection``): k1 keeps
    reject_low <= rho (seq_sum: the product, seq_mean: the geometric mean) <= reject_high; k2 / k3 keep the
    divergence <= reject_high. ``none``: the paper's setting (the weight is truncated, nothing rejected). With
    ``logp_old_source: rollout`` it bounds pi_theta/mu_old in each update's loss instead, the denominators unchanged."""
    reject_low: float = Field(0.0, ge=0)
    """k1 rules: the lowest ratio kept (0 = no lower bound)."""
    reject_high: float = Field(math.inf, gt=0)
    """k1 rules: the highest ratio kept; k2 / k3: the largest divergence kept (inf = no bound)."""
    logp_old_source: Literal["trainer", "rollout"] = "trainer"
    """Where ``logp_old`` (pi_old) comes from: ``trainer`` = the trainer's pass at theta_old (the paper's: the clip
    mask measures staleness, the weight pi_old/mu_old the training–inference gap); ``rollout`` = the engine's
    ``logp_rollout`` (verl's ``rollout_correction.bypass_mode``: pi_old := mu_old, no old-log-prob pass, so the
    clip mask and ratios see both gaps at once). With ``rollout`` the monitor's pi_old (``mismatch/*``,
    ``train/entropy``, ``routing/train_infer_*``) is the first update's forward, at theta_old, on the first
    mini-batch (the whole batch when N = 1); ``reject`` then bounds each update's pi_theta/mu_old in its loss (verl's
    bypass-mode rejection). Not with R2 (it records its routes in that pass)."""

    @model_validator(mode="after")
    def _reject_bounds(self) -> LossConfig:
        if self.reject_low >= self.reject_high:
            raise ValueError(f"reject_low ({self.reject_low}) must be below reject_high ({self.reject_high})")
        if self.entropy_coef_min > self.entropy_coef_max:
            raise ValueError(f"entropy_coef_min ({self.entropy_coef_min}) must not exceed entropy_coef_max "
                             f"({self.entropy_coef_max})")
        if self.top_entropy_quantile < 1 and getattr(self, "name", None) == "gspo":
            raise ValueError("top_entropy_quantile < 1: gspo weighs whole responses, it has no per-token terms to keep")
        if self.multi_objective_aggregation == "normalize_then_sum" and (
                self.adv_baseline != "group_mean" or self.adv_std_scope != "group"
                or (self.adv_whiten and self.adv_whiten_over != "tokens")
                or self.adv_nonzero_rescale or self.reward_clip_range is not None):
            raise ValueError("multi_objective_aggregation=normalize_then_sum normalises the rewards itself: leave "
                             "adv_baseline, adv_std_scope, adv_nonzero_rescale and reward_clip_range at their defaults "
                             "(adv_whiten: its last whitening over tokens, verl's gdpo, instead of over responses)")
        if self.adv_gamma != 1 and not (self.adv_token_returns or self.adv_baseline == "critic"):
            raise ValueError("algo.adv_gamma: it discounts token-level returns: set algo.adv_token_returns: true or "
                             "adv_baseline: critic (or 1)")
        if self.adv_lambda != 1 and self.adv_baseline != "critic":
            raise ValueError("algo.adv_lambda: GAE's lambda needs a critic: set algo.adv_baseline: critic (or 1)")
        if self.adv_baseline in ("critic", "optimal_token"):
            self._check_per_token_baseline()
        if self.adv_token_returns:
            self._check_token_returns()
        if self.adv_token_kl:
            self._check_token_kl()
        if self.reward_clip_range is not None and self.reward_clip_range[0] >= self.reward_clip_range[1]:
            raise ValueError(f"reward_clip_range {list(self.reward_clip_range)}: the low bound must be below the high")
        return self

    def _per_token_conflict(self, more: dict[str, bool]) -> str | None:
        """The first setting on that per-token advantages do not go with: ``more``'s, then whitening over responses,
        OPSM and GSPO's sequence loss."""
        off = {**more, "adv_whiten_over=responses": self.adv_whiten and self.adv_whiten_over == "responses",
               "opsm_threshold": getattr(self, "opsm_threshold", None) is not None,
               "name=gspo": getattr(self, "name", None) == "gspo"}
        return next((name for name, on in off.items() if on), None)

    def _check_token_returns(self) -> None:
        problem = self._per_token_conflict({
            f"adv_baseline={self.adv_baseline}": self.adv_baseline not in ("none", "greedy"),
            "adv_std_normalize": self.adv_std_normalize, "adv_nonzero_rescale": self.adv_nonzero_rescale,
            "multi_objective_aggregation=normalize_then_sum": self.multi_objective_aggregation == "normalize_then_sum"})
        if problem:
            raise ValueError(f"algo.adv_token_returns: verl's REINFORCE++ / ReMax token returns do not go with "
                             f"{problem}: they take adv_baseline none or greedy, no group std or rescale, a "
                             "token-level loss (not gspo) and no OPSM")

    def _check_per_token_baseline(self) -> None:
        problem = self._per_token_conflict({
            "adv_std_normalize": self.adv_std_normalize, "adv_token_returns": self.adv_token_returns,
            "adv_token_kl": self.adv_token_kl, "adv_nonzero_rescale": self.adv_nonzero_rescale,
            "multi_objective_aggregation=normalize_then_sum": self.multi_objective_aggregation == "normalize_then_sum"})
        if problem:
            raise ValueError(f"algo.adv_baseline={self.adv_baseline}: its per-token advantages do not go with {problem}: "
                             "they take no group std or rescale, no other token advantages, whitening over tokens, a "
                             "token-level loss (not gspo) and no OPSM")
        if self.adv_baseline == "optimal_token" and getattr(self, "logp_old_source", "trainer") == "rollout":
            raise ValueError("algo.adv_baseline=optimal_token: its weights need the trainer's pi_old pass (sum pi_old^2, "
                             "as verl's actor computes it); set algo.logp_old_source: trainer")

    def _check_token_kl(self) -> None:
        if not self.kl_in_reward_coef:
            raise ValueError("algo.adv_token_kl: each token's advantage less kl_in_reward_coef x its KL; set "
                             "algo.kl_in_reward_coef > 0 (and a reference it measures against), or adv_token_kl false")
        problem = self._per_token_conflict({"adv_token_returns": self.adv_token_returns})
        if problem:
            raise ValueError(f"algo.adv_token_kl: slime's per-token KL in the advantage does not go with {problem}: "
                             "it needs a token-level loss (not gspo), no OPSM, whitening over tokens, and the KL in "
                             "either each token's advantage or its return (adv_token_returns), not both")

    whole_groups: ClassVar[bool] = False
    """The loss normalises by each group's token count, so mini- and micro-batches must hold whole
    groups (checked with the batch sizes)."""

    def loss_knobs(self) -> dict[str, Any]:
        """Keyword arguments of ``POLICY_LOSSES[name]`` (everything but the name, advantage and KL knobs)."""
        return self.model_dump(exclude={"name", "adv_std_normalize", "adv_std_eps", "adv_std_scope", "adv_baseline", "adv_whiten",
                                        "adv_nonzero_rescale", "adv_whiten_over", "reward_clip_range",
                                        "adv_token_returns", "adv_gamma", "adv_token_kl", "adv_lambda",
                                        "multi_objective_aggregation",
                                        "kl_coef", "kl_loss_type", "kl_loss_unbiased", "ref_sync_every_updates",
                                        "ref_sync_alpha",
                                        "kl_in_reward_coef", "kl_in_reward_type", "kl_in_reward_target",
                                        "kl_in_reward_horizon", "entropy_coef", "top_entropy_quantile", "entropy_target",
                                        "router_aux_loss_coef",
                                        "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
                                        "mask_truncated", "reject",
                                        "reject_low", "reject_high", "logp_old_source"})

    def minibatch_normalizer(self, minibatch: Any) -> float:
        """The loss's denominator over a whole mini-batch (a ``Batch``), so that the losses of its
        micro-batches add up to the mini-batch loss: by default the number of responses."""
        return float(minibatch.size)


class MiniRLConfig(LossConfig):
    """MiniRL (paper Eq. 7) and its ablations, as values."""

    name: Literal["minirl"] = "minirl"
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    eps_low: float = Field(0.2, ge=0, lt=1)
    """Clip range below 1 of the ratio pi_theta/pi_old."""
    eps_high: float = Field(0.27, ge=0)
    """Clip range above 1 of the ratio pi_theta/pi_old."""
    clip: bool = True
    """PPO-style token mask on pi_theta/pi_old (off = 'w/o clipping' arms)."""
    is_correction: bool = True
    """Training–inference IS weight pi_theta/mu_old (off = 'w/o IS correction' arm)."""
    tis_cap: float = Field(5.0, gt=0)
    """Truncation of the training-inference IS weight."""
    tis_placement: Literal["full", "train_infer"] = "full"
    """full: IS weight pi_theta/mu_old; train_infer: pi_old/mu_old."""
    tis_floor: TisFloor = 0.0
    tis_mode: TisMode = "truncate"
    tis_level: TisLevel = "token"
    opsm_threshold: OpsmThreshold = None
    dual_clip: DualClip = None
    staleness_weight: bool = True
    """Weigh each token by pi_theta/pi_old (times pi_old/mu_old: Eq. 7's pi_theta/mu_old). false: by the bounded
    pi_old/mu_old alone (1 without is_correction): REINFORCE on stale samples with no correction for the updates since
    they were drawn (GPG's loss, verl's bypass REINFORCE without IS weights). Not in the paper; on-policy the same."""
    _tis_bounds = model_validator(mode="after")(_check_tis_bounds)
    aggregation: Literal["seq_sum", "seq_mean", "token_mean"] = "seq_sum"
    """seq_sum = MiniRL (no length normalisation); seq_mean = '+ length normalisation' arm."""
    normalizer: float | None = Field(None, gt=0)
    """Constant divisor for seq_sum (default: responses per mini-batch)."""

    def minibatch_normalizer(self, minibatch: Any) -> float:
        """token_mean: the mini-batch's trained tokens; seq_sum: ``normalizer`` if set; else responses."""
        if self.aggregation == "token_mean":
            return float(max(int(minibatch.mask.sum()), 1))
        if self.aggregation == "seq_sum" and self.normalizer is not None:
            return float(self.normalizer)  # a user's constant
        return float(minibatch.size)


class GRPOConfig(LossConfig):
    """GRPO as written in the paper's Appendix A (1/|y| per response, PPO min/clip on pi/pi_old)."""

    name: Literal["grpo"]
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    eps_low: float = Field(0.2, ge=0, lt=1)
    """Clip range below 1 of the ratio pi_theta/pi_old."""
    eps_high: float = Field(0.27, ge=0)
    """Clip range above 1 of the ratio pi_theta/pi_old."""
    is_correction: bool = False
    """Multiply by the truncated training–inference factor min(pi_old/mu_old, tis_cap)."""
    tis_cap: float = Field(5.0, gt=0)
    """Truncation of the training-inference IS weight."""
    tis_floor: TisFloor = 0.0
    tis_mode: TisMode = "truncate"
    tis_level: TisLevel = "token"
    opsm_threshold: OpsmThreshold = None
    dual_clip: DualClip = None
    _tis_bounds = model_validator(mode="after")(_check_tis_bounds)
    adv_std_normalize: bool = True


class CISPOConfig(LossConfig):
    """CISPO (paper Appendix A): detached clipped ratio x log pi, per-group token normalisation, no mask."""

    name: Literal["cispo"]
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    eps_low: float = Field(0.2, ge=0)
    """Clip range below 1 of the ratio pi_theta/pi_old (>= 1: no lower clip, as the CISPO paper and TRL's)."""
    eps_high: float = Field(0.27, ge=0)
    """Clip range above 1 of the ratio pi_theta/pi_old."""
    is_correction: bool = False
    tis_cap: float = Field(5.0, gt=0)
    """Truncation of the training-inference IS weight."""
    tis_floor: TisFloor = 0.0
    tis_mode: TisMode = "truncate"
    tis_level: TisLevel = "token"
    opsm_threshold: OpsmThreshold = None
    _tis_bounds = model_validator(mode="after")(_check_tis_bounds)
    adv_std_normalize: bool = True
    whole_groups: ClassVar[bool] = True

    aggregation: Literal["group", "token_mean"] = "group"
    """group: each group's tokens, then the mean over groups ([P] App. A); token_mean: the mini-batch's tokens
    (ScaleRL's and TRL's ``loss_type="cispo"``)."""

    def minibatch_normalizer(self, minibatch: Any) -> float:
        """group: the mini-batch's number of distinct groups; token_mean: its trained tokens."""
        import torch

        if self.aggregation == "token_mean":
            return float(max(int(minibatch.mask.sum()), 1))
        return float(torch.unique(minibatch.group_ids).numel())


class GSPOConfig(LossConfig):
    """GSPO (arXiv 2507.18071): length-normalised sequence ratio, sequence-level clipping."""

    name: Literal["gspo"]
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    eps_low: float = Field(3e-4, ge=0, lt=1)
    """Clip range below 1 of the ratio pi_theta/pi_old."""
    eps_high: float = Field(4e-4, ge=0)
    """Clip range above 1 of the ratio pi_theta/pi_old."""
    length_weighted: bool = False
    """LUSPO (arXiv 2602.05261; TRL's ``loss_type='luspo'`` with ``importance_sampling_level='sequence'``): each
    response's term weighed by its length |y_i|, so that long responses are not down-weighted. False: GSPO's."""
    sequence_ratio: Literal["mean", "sum"] = "mean"
    """The response's log-ratio: its tokens' mean (GSPO's length-normalised ratio) or sum (the response's own
    pi_theta(y)/pi_old(y), clipped as one: TRL's ``RLOOTrainer``)."""
    adv_std_normalize: bool = True


class SAPOConfig(LossConfig):
    """SAPO (arXiv 2511.20347): GRPO with a smooth, temperature-controlled gate instead of the hard clip."""

    name: Literal["sapo"]
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    tau_pos: float = Field(1.0, gt=0)
    """Gate temperature of tokens with A > 0 (TRL's ``sapo_temperature_pos``)."""
    tau_neg: float = Field(1.05, gt=0)
    """Gate temperature of tokens with A <= 0: higher decays their gradient faster off policy (``sapo_temperature_neg``)."""
    is_correction: bool = False
    """Multiply by the truncated training–inference factor min(pi_old/mu_old, tis_cap)."""
    tis_cap: float = Field(5.0, gt=0)
    """Truncation of the training-inference IS weight."""
    tis_floor: TisFloor = 0.0
    tis_mode: TisMode = "truncate"
    tis_level: TisLevel = "token"
    opsm_threshold: OpsmThreshold = None
    _tis_bounds = model_validator(mode="after")(_check_tis_bounds)
    adv_std_normalize: bool = True


class VESPOConfig(LossConfig):
    """VESPO (arXiv 2602.10693): REINFORCE weighed by a Gamma kernel of each response's sequence ratio, no clip."""

    name: Literal["vespo"]
    """The objective: minirl | grpo | cispo | gspo | sapo | vespo."""
    k_pos: float = Field(2.0, ge=0)
    """Shape k of the kernel e^lambda w^k e^(-lambda w) for A >= 0 (TRL's ``vespo_k_pos``)."""
    lambda_pos: float = Field(3.0, ge=1e-4)
    """Its rate lambda for A >= 0 (``vespo_lambda_pos``)."""
    k_neg: float = Field(3.0, ge=0)
    """Shape k for A < 0 (``vespo_k_neg``)."""
    lambda_neg: float = Field(2.0, ge=1e-4)
    """Rate lambda for A < 0 (``vespo_lambda_neg``)."""
    is_correction: bool = False
    """Put the bounded training–inference factor pi_old/mu_old of each token into the sequence ratio (TRL with vLLM)."""
    tis_cap: float = Field(5.0, gt=0)
    """Upper bound of that factor."""
    tis_floor: TisFloor = 0.0
    tis_mode: TisMode = "truncate"
    _tis_bounds = model_validator(mode="after")(_check_tis_bounds)
    adv_std_normalize: bool = True

    def minibatch_normalizer(self, minibatch: Any) -> float:
        """The mini-batch's trained tokens (TRL divides VESPO's token sum by ``num_items_in_batch``)."""
        return float(max(int(minibatch.mask.sum()), 1))


OBJECTIVES = ("minirl", "grpo", "cispo", "gspo", "sapo", "vespo")
AlgoConfig = Annotated[MiniRLConfig | GRPOConfig | CISPOConfig | GSPOConfig | SAPOConfig | VESPOConfig,
                       Field(discriminator="name")]


class MoEConfig(Section):
    routing_replay: Literal["none", "R2", "R3"] = "none"
    """none | R2 (replay the trainer's own routes at theta_old) | R3 (replay the engine's routes)."""
    routing_metrics: bool = True
    """Log ``routing/*`` every step (MoE models): engine vs trainer routing, and R2's per-update
    drift. Makes the engine record its routes every step whatever ``routing_replay`` is."""

    @field_validator("routing_replay", mode="before")
    @classmethod
    def _one_mode(cls, value: Any) -> Any:
        text = str(value).upper().replace(" ", "")
        if isinstance(value, (list, tuple)) or ("R2" in text and "R3" in text):
            raise ValueError("R2 and R3 cannot be combined: R2 replays the trainer's own routes, R3 the engine's; pick one")
        return value


class EvalConfig(Section):
    every_steps: int = Field(25, ge=0)
    """Held-out evaluation every k global steps (0 = only before and after training)."""
    num_prompts: int = Field(64, ge=1)
    """Held-out prompts per evaluation."""
    samples_per_prompt: int = Field(4, ge=1)
    """mean@n: accuracy averaged over n samples per prompt (the paper's mean@32)."""
    accuracy_threshold: float = Field(1.0, allow_inf_nan=False)
    """A sample counts as correct in ``eval/accuracy`` and ``train/accuracy`` when its reward is at
    least this (1 = the built-in 0/1 verifiers); ``eval/reward_mean`` is logged beside it."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature at evaluation; 0 = greedy (argmax, verl's ``val_kwargs.temperature: 0``;
    with ``samples_per_prompt: 1``, as its n samples would be identical)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass at evaluation."""
    top_k: int = Field(0, ge=0)
    """Top-k at evaluation (0 = off)."""
    min_p: float = Field(0.0, ge=0, lt=1)
    """Min-p at evaluation (0 = off)."""
    repetition_penalty: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Repetition penalty at evaluation (1 = off; ``rollout.repetition_penalty``)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Defaults to rollout.max_new_tokens."""

    @model_validator(mode="after")
    def _greedy_takes_one_sample(self) -> EvalConfig:
        if self.temperature == 0 and self.samples_per_prompt != 1:
            raise ValueError(f"eval.samples_per_prompt: greedy evaluation (eval.temperature 0) gives identical samples; "
                             f"set 1 (got {self.samples_per_prompt})")
        return self


class DiagnosticsConfig(Section):
    """The paper's first-order approximation, measured (``minirl.monitor.diagnostics``)."""

    every_steps: int = Field(0, ge=0)
    """Every k global steps, before the first and the last mini-batch update: gradient cosine
    between the surrogate and the sequence-level objective (Eq. 2), first-order residuals, IS
    effective sample sizes and chi^2 (0 = off; costs two extra forward/backward passes)."""


class LogConfig(Section):
    console: bool = True
    """A progress line on a terminal; one plain line per step when stdout is not one (a SLURM log)."""
    plain: bool = False
    """One plain line per step even on a terminal (no progress line)."""
    completions_every_steps: int = Field(10, ge=0)
    """Every k global steps, write a few sampled (prompt, completion, reward) to ``samples.jsonl``
    in the run directory and to TensorBoard / wandb (TRL's ``log_completions``; 0 = never)."""
    completions_per_step: int = Field(4, ge=1)
    """How many completions ``completions_every_steps`` logs."""
    tensorboard: bool = False
    """Write TensorBoard events to ``RUN_DIR/tensorboard``."""
    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_project: str = "minirl"
    """The wandb project."""


class CriticConfig(Section):
    """The learned value model of ``algo.adv_baseline: critic`` (verl's ``critic.*``): the policy's starting weights (or
    ``model_path``) with a scalar head, trained each step before the policy on the same mini-batches with PPO's
    clipped value loss (``minirl.critic``). AdamW's betas and eps are ``optim``'s."""

    lr: float = Field(1e-5, ge=0, le=1)
    """The critic's learning rate (verl's ``critic.optim.lr``), constant after its warm-up."""
    lr_warmup_updates: int = Field(0, ge=0)
    """Critic updates over which its learning rate rises linearly to ``lr`` ((k + 1) / W, as ``optim.warmup_updates``;
    verl's ``critic.optim.lr_warmup_steps``, slime's ``--critic-lr-warmup-iters``); 0 = none."""
    weight_decay: float = Field(0.01, ge=0)
    """AdamW's decoupled weight decay (verl's ``critic.optim.weight_decay``)."""
    grad_clip_norm: float | None = Field(1.0, gt=0)
    """Clip the critic's gradient to this global norm (verl's ``critic.grad_clip``; null = off)."""
    loss_aggregation: Literal["token_mean", "seq_mean", "seq_sum", "seq_sum_norm"] = "token_mean"
    """How the value loss averages a mini-batch: over its trained tokens (verl's ``token-mean``), each response's token
    mean averaged (``seq-mean-token-mean``; slime's without ``--calculate-per-token-loss``), each response's token
    sum averaged (``seq-mean-token-sum``), or that divided by ``rollout.max_new_tokens`` as well
    (``seq-mean-token-sum-norm``, whose divisor is the padded response width, ``data.max_response_length``)."""
    clip_value_range: float = Field(0.5, gt=0)
    """c of the clipped value loss: the new value counts within V_old +- c (verl's ``critic.cliprange_value``)."""
    warmup_steps: int = Field(0, ge=0)
    """The policy trains from this global step on; before it only the critic does (verl's ``trainer.critic_warmup``;
    0 and 1: from the first step)."""
    epochs_per_step: int | None = Field(None, ge=1)
    """Passes of the critic over the step's mini-batches (verl's ``critic.ppo_epochs``; null = ``optim.epochs_per_step``)."""
    model_path: str | None = None
    """A Hugging Face model directory to start the critic from (verl's ``critic.model.path``; its head is new unless
    it was saved with one); null = the policy's starting weights (after any cold start)."""
    lora: LoRAConfig | None = None
    """LoRA adapters on the critic's transformer (verl's ``critic.model.lora_rank``, ``lora_alpha``,
    ``target_modules``): the adapters and the value head train, the rest stays frozen; null = every weight trains."""


class ColdStartConfig(Section):
    """Supervised fine-tuning on teacher traces (``minirl sft``, or before RL in ``minirl train``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)  # every value finite

    enabled: bool = False
    """In ``minirl train``: run SFT first and start RL from its checkpoint."""
    data: str | list[str] | None = None
    """Your SFT data (.jsonl, .json, .parquet or a datasets directory) in TRL's shapes: rows
    ``{"prompt", "completion"}`` (strings or chat messages), ``{"messages": [...]}`` or ``{"text": ...}``
    (trained whole); a list: their rows one after another (verl's SFT list of ``data.train_files``); null = the
    task's teacher traces in ``style``."""
    dataset_config: str | None = None
    """A dataset repository directory ``data``'s config (TRL SFT's ``dataset_config``); null: its only or default one."""
    split: str = "train"
    """The split of a dataset directory ``data`` to train on (TRL SFT's ``dataset_train_split``)."""
    prompt_column: str = "prompt"
    """Column of ``data`` holding the prompt (TRL's ``prompt``; verl's SFT ``data.prompt_key``); a dotted name
    reads a field of an object column (verl's ``prompt_dict_keys``: ``extra_info.question``)."""
    completion_column: str = "completion"
    """Column of ``data`` holding the completion (TRL's ``completion``; verl's SFT ``data.response_key``); dotted
    names as ``prompt_column``."""
    chat_prompts: bool = False
    """A string prompt is one user message through the chat template (as the engine renders a chat prompt),
    followed by its string completion as text + EOS: verl's SFT layout (false: TRL's rule, plain text)."""
    loss_on: Literal["completion", "all"] = "completion"
    """Tokens that carry the SFT loss: the completion / assistant tokens only (TRL's
    ``completion_only_loss`` / ``assistant_only_loss``), or the whole sequence."""
    packing: bool = False
    """Join whole examples of ``data`` into rows of at most ``max_length`` tokens."""
    max_length: int = Field(1024, ge=2)
    """Tokens per SFT row of ``data`` (longer rows are cut)."""
    style: str = "stepwise"
    """Teacher style of the worked solutions (see the task's ``styles``)."""
    examples: int = Field(2000, ge=1)
    """Teacher traces generated (synthetic tasks)."""
    steps: int = Field(300, ge=1)
    """SFT optimizer steps; with ``until_loss``, the most it may take. A step whose update was skipped (an fp16
    overflow, a numerical fault) counts, as skipped iterations do in Megatron-LM's and HF ``Trainer``'s step counts."""
    until_loss: float | None = Field(None, gt=0)
    """Stop early once the token cross-entropy, averaged over the last ``loss_window_steps`` steps, is
    below this (nats per token). Gives every teacher style the same fit, whatever its trace length
    (``null``: always ``steps``)."""
    loss_window_steps: int = Field(20, ge=1)
    """Steps averaged for ``until_loss``."""
    until_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop early once the held-out accuracy (mean@n over ``eval.num_prompts`` x ``eval.samples_per_prompt``
    with the rollout engine, as RL evaluates) reaches this, checked every ``accuracy_every_steps`` SFT steps;
    ``steps`` is the cap. Gives short and long teacher styles the same starting accuracy (``null``: off;
    not together with ``until_loss``)."""
    accuracy_every_steps: int = Field(25, ge=1)
    """SFT steps between two held-out accuracy checks of ``until_accuracy``."""
    batch_sequences: int = Field(32, ge=1)
    """Sequences per SFT step."""
    lr: float = Field(3e-3, gt=0, le=1)
    """SFT learning rate."""
    warmup_steps: int = Field(20, ge=0)
    """SFT learning-rate warm-up steps."""
    output: str | None = None
    """Where ``minirl sft`` saves the checkpoint (default: the run directory's ``checkpoint``)."""
    checkpoint_every_steps: int = Field(0, ge=0)
    """Keep the SFT's state (weights, optimizer, data order) every this many steps in ``OUTPUT/sft_state.pt`` (TRL's
    ``save_steps``): the same command, stopped, continues from it, bitwise as if never stopped; removed once the SFT
    is done. 0: none (a stopped SFT starts again)."""
    seed: int | None = None
    """Seed of the SFT (data order and initial weights); ``null``: ``run.seed``. A fixed value gives every RL
    seed the same cold-start checkpoint, so seeds vary only the RL sampling."""
    cache_dir: str | None = None
    """In ``minirl train``: reuse an SFT checkpoint from this directory when one was made from the same
    model, task, cold-start knobs, optimizer and seed (key = hash of those); else make it there once."""


class CheckpointConfig(Section):
    every_steps: int = Field(50, ge=0)
    """Save a resumable checkpoint every this many global steps (0 = only at the end)."""
    keep_last: int = Field(2, ge=1)
    """Complete checkpoints kept in ``RUN_DIR/checkpoints`` (older ones are deleted)."""


class ClusterConfig(Section):
    """Where the run computes (``docs/distributed.md``). The defaults are one process on this
    machine: the trainer and one built-in rollout engine side by side, as before this section."""

    backend: Literal["local", "ray"] = "local"
    """local: this process is the controller and holds the engines (trainer ranks > 1 are spawned
    processes); ray: the controller places the engines and the trainer ranks as Ray actors."""
    ray_address: str | None = None
    """backend=ray: the cluster to join (e.g. ``auto`` or ``ray://head:10001``); null starts a
    local Ray instance."""
    trainer_ranks: int = Field(1, ge=1)
    """W: torch.distributed ranks of the trainer (FSDP2 ``fully_shard``; gloo on CPU, NCCL on GPU).
    Each rank processes 1/W of every (mini-)batch; gradients are summed across ranks."""
    collective_timeout_s: float = Field(600.0, gt=0)
    """How long a trainer rank waits in one collective (an FSDP all-gather or reduce-scatter, a norm's all-reduce)
    before it fails the run in one line (verl's ``nccl_timeout``, 600 s; torch's own default is 30 minutes on gloo).
    Raise it for a model whose full-state gather for a checkpoint or a weight sync takes longer."""
    rollout_engines: int = Field(1, ge=1)
    """E: rollout engines; the prompts of a step are split across them in contiguous chunks."""
    engine_backend: Literal["native", "vllm"] = "native"
    """native: minirl's built-in engine (``rollout.precision`` applies); vllm: vLLM (GPU, the
    ``minirl[vllm]`` extra)."""
    sample_seeding: Literal["per_batch", "per_sample"] = "per_batch"
    """native engine: per_batch draws each engine batch from one stream per step seed (the
    single-process behaviour of earlier runs); per_sample gives every response its own stream keyed
    by (step seed, prompt position in the step, sample index), so completions do not depend on how
    prompts are split across ``rollout_engines``."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the trainer ranks and the native engines compute (cuda: one GPU per actor)."""
    cpus_per_engine: float = Field(1.0, ge=0)
    """backend=ray: CPUs each engine actor reserves."""
    gpus_per_engine: float = Field(0.0, ge=0)
    """backend=ray: GPUs each engine actor reserves."""
    cpus_per_trainer_rank: float = Field(1.0, ge=0)
    """backend=ray: CPUs each trainer rank reserves."""
    gpus_per_trainer_rank: float = Field(0.0, ge=0)
    """backend=ray: resources each actor reserves (fractions allowed, as in ``ray.remote``)."""

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        if self.engine_backend == "vllm" and self.backend == "local" and self.rollout_engines > 1:
            raise ValueError("cluster.rollout_engines: several vLLM engines need backend=ray (one GPU each)")
        if self.backend == "ray" and self.device == "cuda" and (self.gpus_per_engine <= 0 or self.gpus_per_trainer_rank <= 0):
            raise ValueError("cluster.device: cuda under backend=ray needs gpus_per_engine and gpus_per_trainer_rank > 0")
        return self


class Config(Section):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    optim: OptimConfig = OptimConfig()
    algo: AlgoConfig = MiniRLConfig()
    moe: MoEConfig = MoEConfig()
    eval: EvalConfig = EvalConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    log: LogConfig = LogConfig()
    cold_start: ColdStartConfig = ColdStartConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    cluster: ClusterConfig = ClusterConfig()
    critic: CriticConfig = CriticConfig()

    @property
    def global_batch_sequences(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.samples_per_prompt

    @property
    def updates_per_step(self) -> int:
        """Gradient updates per global step: N mini-batches x E epochs."""
        return self.optim.minibatches_per_step * self.optim.epochs_per_step

    @property
    def minibatch_sequences(self) -> int:
        return self.global_batch_sequences // self.optim.minibatches_per_step

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    @model_validator(mode="before")
    @classmethod
    def _default_objective(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("algo"), dict) and "name" not in data["algo"]:
            data["algo"] = {"name": "minirl", **data["algo"]}
        return data

    def _check_bypass(self) -> None:
        """``algo.logp_old_source: rollout`` (verl's bypass mode) skips the pass R2 records its routes in."""
        if self.algo.logp_old_source != "rollout":
            return
        if self.moe.routing_replay == "R2":
            raise ValueError("algo.logp_old_source=rollout: R2 records the trainer's routes in the old-log-prob pass, "
                             "which bypassing it skips; use moe.routing_replay=R3 (the engine's routes) or trainer")
        if self.algo.adv_baseline == "critic" and self.critic.warmup_steps > 1:
            raise ValueError("critic.warmup_steps: the steps without a policy update have no forward at theta_old for "
                             "the monitor under algo.logp_old_source=rollout; set algo.logp_old_source: trainer or 0")

    def _check_tools(self) -> None:
        """``task.tools`` / ``task.environment``: calls and results are written by the chat template, and a response is
        sampled whole."""
        if not self.task.calls_tools:  # the other tool keys may be set for tools given later
            return
        key = self.task.tools_key
        if self.task.chat_template == "plain":
            raise ValueError(f"{key}: tool calls and their results are written by the chat template; "
                             "task.chat_template=plain has none (use auto or a template file)")
        if self.rollout.partial_rollout:
            raise ValueError(f"{key}: a response with tool calls is sampled whole within its step; "
                             "set rollout.partial_rollout=false")

    def _check_async(self) -> None:
        """``rollout.async_steps``: a CUDA-graph capture must not overlap the update's kernels in one process (the
        single-process placement; spawned trainer ranks and Ray actors run the update elsewhere)."""
        if self.rollout.async_split_mismatch and not self.rollout.async_steps:
            raise ValueError("rollout.async_split_mismatch: splits the mismatch of a batch sampled a step ahead; it "
                             "needs rollout.async_steps=1 (a synchronous batch has no lag: mismatch/* is the engine's gap)")
        if self.rollout.async_split_mismatch and self.rollout.async_steps > 1:
            raise ValueError(f"rollout.async_split_mismatch: keeps one copy of the weights, those of a batch one step "
                             f"ahead; with rollout.async_steps={self.rollout.async_steps} a batch was sampled "
                             f"{self.rollout.async_steps} steps back (set async_steps=1 or async_split_mismatch=false)")
        self._check_partial()
        c = self.cluster
        shared = c.backend == "local" and c.trainer_ranks == 1
        if self.rollout.async_steps and self.rollout.cuda_graphs and c.device == "cuda" and shared:
            raise ValueError("rollout.async_steps: the rollout beside the update cannot capture CUDA graphs in the "
                             "trainer's process (a capture forbids other work on the device); set "
                             "rollout.cuda_graphs=false or async_steps=0, or run the trainer as ranks")

    def _check_partial(self) -> None:
        """``rollout.partial_rollout``: what its pool goes with."""
        r = self.rollout
        if not r.partial_rollout:
            for key in ("partial_pool_prompts", "partial_mask_stale"):
                if getattr(r, key) not in (None, False):
                    raise ValueError(f"rollout.{key}: applies under rollout.partial_rollout=true (set it, or drop this)")
            return
        if r.partial_pool_prompts is not None and r.partial_pool_prompts < r.prompts_per_step:
            raise ValueError(f"rollout.partial_pool_prompts: the pool must hold at least the step's prompts_per_step = "
                             f"{r.prompts_per_step} groups (got {r.partial_pool_prompts})")
        if self.algo.adv_baseline == "greedy":
            raise ValueError("algo.adv_baseline=greedy: ReMax's greedy completions are sampled for one draw of prompts; "
                             "rollout.partial_rollout trains groups drawn in earlier steps: set one off")

    def _check_reference(self) -> None:
        """The reference policy's settings: the KL in the loss or the reward, and TR-DPO's sync."""
        a = self.algo
        if a.kl_in_reward_coef and a.multi_objective_aggregation == "normalize_then_sum":
            raise ValueError("algo.kl_in_reward_coef: GDPO's advantages (normalize_then_sum) are formed from each reward "
                             "function's values; the KL in the reward has no place there: set it to 0")
        if a.ref_sync_every_updates is not None and not (a.kl_coef or a.kl_in_reward_coef):
            raise ValueError("algo.ref_sync_every_updates: a reference sync needs a reference (algo.kl_coef or "
                             "algo.kl_in_reward_coef > 0); set it to null")
        if a.ref_sync_every_updates is not None and self.model.lora is not None:
            raise ValueError("algo.ref_sync_every_updates: with LoRA the reference is the base model (adapters off), "
                             "there is no copy to sync (as in TRL); set it to null")

    @model_validator(mode="after")
    def _batch_sizes(self) -> Config:
        total, n = self.global_batch_sequences, self.optim.minibatches_per_step
        if total % n:
            raise ValueError(
                f"optim.minibatches_per_step: must divide the global batch "
                f"prompts_per_step x samples_per_prompt = {total} (got {n})"
            )
        group, loss = self.rollout.samples_per_prompt, self.algo.name.upper()
        # CISPO's per-group denominators need whole groups; its token mean (the mini-batch's tokens) does not
        whole_groups = self.algo.whole_groups and getattr(self.algo, "aggregation", "group") == "group"
        if whole_groups and (self.minibatch_sequences % group or self.optim.micro_batch_sequences % group):
            raise ValueError(
                f"optim.micro_batch_sequences: {loss} normalises by each group's token count, so mini- and "
                f"micro-batches must hold whole groups (multiples of samples_per_prompt = {group})"
            )
        if whole_groups and self.optim.micro_batch_max_tokens is not None:
            raise ValueError(
                f"optim.micro_batch_max_tokens: {loss} normalises by each group's token count, so micro-batches "
                "must hold whole groups; dynamic micro-batches group rows by length (set it to null)"
            )
        ranks = self.cluster.trainer_ranks
        if self.minibatch_sequences % ranks:
            raise ValueError(
                f"cluster.trainer_ranks: must divide the mini-batch of {self.minibatch_sequences} sequences "
                f"(each rank trains on an equal share; got {ranks})"
            )
        if ranks > 1 and whole_groups and (self.minibatch_sequences // ranks) % group:
            raise ValueError(
                f"cluster.trainer_ranks: {loss} needs whole groups on every rank: mini-batch {self.minibatch_sequences} / "
                f"{ranks} ranks is not a multiple of samples_per_prompt = {group}"
            )
        self._check_reference()
        self._check_bypass()
        self._check_async()
        self._check_tools()
        self._check_one_sample()
        per_token = self.algo.adv_token_returns or self.algo.adv_token_kl or self.algo.adv_baseline in (
            "critic", "optimal_token")
        if per_token and self.diagnostics.every_steps:
            which = ("adv_token_returns" if self.algo.adv_token_returns else "adv_token_kl" if self.algo.adv_token_kl
                     else f"adv_baseline={self.algo.adv_baseline}")
            raise ValueError("diagnostics.every_steps: the first-order diagnostics compare with the sequence-level "
                             f"objective, one advantage per response; algo.{which} gives one per token (set 0)")
        if self.algo.adv_baseline == "greedy" and self.rollout.filter_groups:
            raise ValueError("algo.adv_baseline=greedy: ReMax's greedy completions are sampled for one draw of prompts; "
                             "with rollout.filter_groups (several rounds) there is none to pair them with: set one off")
        return self


    def _check_one_sample(self) -> None:
        """One response a prompt (``rollout.samples_per_prompt: 1``): only with what needs no group; whitening over the
        step's tokens needs two responses (one could be one token)."""
        a = self.algo
        if a.adv_whiten and self.global_batch_sequences < 2:
            raise ValueError(f"algo.adv_whiten: whitening over the step's {a.adv_whiten_over} needs 2 or more "
                             "responses a step (rollout.prompts_per_step x samples_per_prompt is 1)")
        if self.rollout.samples_per_prompt != 1:
            return
        if a.adv_baseline not in ("none", "critic", "greedy"):
            raise ValueError(f"rollout.samples_per_prompt=1: algo.adv_baseline={a.adv_baseline} compares each response "
                             "with its group's others; one response a prompt needs algo.adv_baseline none (REINFORCE++ "
                             "with adv_whiten), critic (PPO's GAE) or greedy (ReMax), or 2 or more samples")
        group_only = next((setting for setting, on in (
            ("algo.adv_std_normalize (the group's std)", a.adv_std_normalize and a.adv_std_scope == "group"),
            ("algo.multi_objective_aggregation=normalize_then_sum (each function normalised in its group)",
             a.multi_objective_aggregation == "normalize_then_sum"),
            ("rollout.filter_groups (groups whose rewards differ)", self.rollout.filter_groups)) if on), None)
        if group_only is not None:
            raise ValueError(f"rollout.samples_per_prompt=1: {group_only} needs groups; turn it off, or sample 2 or "
                             "more responses a prompt")


# ----------------------------------------------------------------------------- loading


def format_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = list(first["loc"])
    if loc[:1] == ["algo"] and len(loc) > 1 and loc[1] in OBJECTIVES:
        variant = loc.pop(1)  # the union tag: report algo.clip, not algo.gspo.clip
        if first["type"] == "extra_forbidden":
            from minirl.config_docs import did_you_mean

            where = f"{source}: " if source else ""
            variants: dict[str, type[BaseModel]] = {"minirl": MiniRLConfig, "grpo": GRPOConfig, "cispo": CISPOConfig, "gspo": GSPOConfig,
                                                      "sapo": SAPOConfig, "vespo": VESPOConfig}
            hint = did_you_mean(variants[str(variant)], str(loc[-1]))  # the tag is a str
            return f"{where}{'.'.join(map(str, loc))}: not a knob of algo.name={variant}{hint}"
    if first["type"] == "union_tag_invalid":
        loc.append("name")
        first = {**first, "msg": f"must be one of {', '.join(map(repr, OBJECTIVES))}", "input": first["input"].get("name")}
    key = ".".join(str(p) for p in loc)
    msg = first["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    where = f"{source}: " if source else ""
    if first["type"] == "value_error" and re.match(r"^[a-z_]+\.[a-z_.]+: ", msg):
        return where + msg  # a cross-field check that already names its key
    if first["type"] == "extra_forbidden":
        from minirl.config_docs import did_you_mean, section_type

        msg = "unknown key" + did_you_mean(section_type(Config, [str(p) for p in loc[:-1]]), str(loc[-1]))
    elif first["type"] != "missing" and "got" not in msg and not isinstance(first["input"], dict):
        msg += f" (got {first['input']!r})"  # a whole section's rule names its values itself
    return f"{where}{key}: {msg}" if key else f"{where}{msg}"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, except that a key given twice in one mapping is an error: YAML forbids it
    and PyYAML silently keeps the last value (``optim.lr`` set twice would train with the second); and
    booleans are YAML 1.2's (true / false only): PyYAML's YAML 1.1 reads ``off``, ``on``, ``yes``, ``no``
    as booleans, so ``update_guard: off`` would arrive as False. A bool field still takes them (pydantic
    reads the strings ``off`` / ``on`` / ``yes`` / ``no`` as booleans)."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {
        first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor`` merges; its keys may be overridden
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte {exc.start}: 0x{raw[exc.start]:02x}); "
                          "save the config file as UTF-8") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}:{exc.line}: duplicate key {exc.key!r} (first at line {exc.first_line}); "
                          "a key may appear once per section") from None
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        mark_line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f"{path}:{mark_line + 1}" if mark_line is not None else str(path)
        raise ConfigError(f"{where}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'} ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a YAML/TOML config file, before overrides and validation (``ConfigError`` on a
    missing or unparsable file); for tools that build configs, like the experiment generator."""
    return _read_file(Path(path))


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one dotted ``a.b.c=value`` override in place; the value is parsed as YAML."""
    if "=" not in override:
        raise ConfigError(f"override {override!r}: expected key=value, e.g. optim.lr=1e-4")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {override!r}: empty key segment")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part} is not a section")
        node = child
    try:
        value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # YAML 1.2 booleans, as files
    except yaml.YAMLError:
        value = raw
    node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` (YAML or TOML; None = all defaults) and apply ``key=value`` overrides."""
    data = _read_file(Path(path)) if path else {}
    for override in overrides:
        apply_override(data, override)
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_error(err, str(path) if path else "")) from None


def dump_config(cfg: Config, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")
