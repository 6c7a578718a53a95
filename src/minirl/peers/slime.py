"""slime: the ``--flag value`` arguments of a launch script's ``python3 train.py`` command (its bash arrays, variables
and the ``ray job submit ... --`` before it expanded), a ``--custom-config-path`` YAML, or flags given directly, read
against slime's defaults (``slime/utils/arguments.py``, THUDM/slime at 002fa9d) and, for the optimizer flags slime
takes from it, Megatron-LM's (``megatron/training/arguments.py``).

slime's loss (``slime/backends/megatron_utils/loss.py``, ``slime/utils/ppo_utils.py``): PPO's clip on pi_theta/pi_old
(pi_old recomputed by Megatron, or the engine's with ``--use-rollout-logprobs``), GSPO's sequence ratio or CISPO's
clamped weight; advantages from group-normalised rewards (``(r - mean) / (std + 1e-6)``, std unbiased) or REINFORCE++;
TIS (``--use-tis``) multiplies each token's loss by clamp(pi_old/mu_old, tis_clip_low, tis_clip); each optimizer step
is the mean over its samples of each sample's token mean, or with ``--calculate-per-token-loss`` a token mean."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import (
    MEGATRON_MODULES,
    CommandOutput,
    Objective,
    Peer,
    Translation,
    Unresolved,
    apply_objective,
    check_label_column,
    count_rows,
    gpu_ranks,
    leftovers,
    note_local_path,
    parse_value,
    read_yaml,
    template_kwargs,
)
from minirl.peers.shell import (
    ARRAY,
    CLOSE,
    COMMAND,
    NAME_VALUE,
    OPEN,
    QUOTED,
    STOPPED,
    UNQUOTED,
    arguments,
    assigned,
    bounds,
    command_behind,
    default_assignments,
    depends_on,
    fields,
    statements,
    unquoted,
    why_unresolved,
)
from minirl.tasks.slime_rewards import SCORERS, SLIME_RM_DEADLINE_S, SLIME_RM_TIMEOUT_S

SLIME_DEFAULTS: dict[str, Any] = {
    # model, checkpoints, seeds
    "hf-checkpoint": None, "load": None, "ref-load": None, "save": None, "save-interval": None, "seed": 1234,
    "rollout-seed": 42,
    # data
    "prompt-data": None, "input-key": "input", "label-key": None, "metadata-key": "metadata", "apply-chat-template": False,
    "tool-key": "tools",
    "apply-chat-template-kwargs": "{}", "rollout-shuffle": False, "num-epoch": None, "num-rollout": None,
    "rollout-max-prompt-len": None,
    # rollout and batches
    "rollout-batch-size": None, "n-samples-per-prompt": 1, "over-sampling-batch-size": None,
    "dynamic-sampling-filter-path": None, "partial-rollout": False, "mask-offpolicy-in-partial-rollout": False, "rollout-max-response-len": None,
    "rollout-temperature": 1.0, "rollout-top-p": 1.0, "rollout-top-k": -1, "rollout-stop": None,
    "global-batch-size": None, "num-steps-per-rollout": None, "micro-batch-size": 1, "use-dynamic-batch-size": False,
    "max-tokens-per-gpu": None,
    # rewards
    "rm-type": None, "rm-url": None, "custom-rm-path": None, "group-rm": False, "reward-key": None, "disable-rewards-normalization": False,
    # the loss
    "advantage-estimator": "grpo", "pg-loss-type": None, "eps-clip": 0.2, "eps-clip-high": None, "eps-clip-c": None,
    "kl-coef": 0.0, "use-kl-loss": False, "kl-loss-coef": 0.0, "kl-loss-type": "k1", "use-unbiased-kl": False,
    "entropy-coef": 0.0, "gamma": 1.0, "normalize-advantages": False, "disable-grpo-std-normalization": False,
    "lambd": 1.0, "value-clip": 0.2, "critic-lr": None, "num-critic-only-steps": 0, "critic-load": None,
    "critic-save": None, "critic-lr-warmup-iters": 0, "critic-num-nodes": None, "critic-num-gpus-per-node": None,
    "calculate-per-token-loss": False, "loss-type": "policy_loss", "use-rollout-logprobs": False, "use-tis": False,
    "tis-clip": 2.0, "tis-clip-low": 0.0, "custom-tis-function-path": None, "get-mismatch-metrics": False,
    "update-weights-interval": 1, "use-opsm": False, "opsm-delta": 1e-4, "custom-advantage-function-path": None,
    "custom-pg-loss-reducer-function-path": None, "use-routing-replay": False, "use-rollout-routing-replay": False,
    # evaluation and logs
    "eval-interval": None, "eval-prompt-data": None, "eval-config": None, "n-samples-per-eval-prompt": 1, "eval-temperature": None,
    "eval-top-p": None, "eval-top-k": None, "eval-max-response-len": None, "use-wandb": False, "wandb-project": None,
    "use-tensorboard": False,
    # the cluster (Megatron's parallel sizes divide the GPUs into data-parallel ranks)
    "actor-num-nodes": 1, "actor-num-gpus-per-node": 8, "colocate": False, "tensor-model-parallel-size": 1,
    "pipeline-model-parallel-size": 1, "context-parallel-size": 1,
    # Megatron-LM's optimizer and schedule (slime resets lr to 1e-6; bf16 is on unless --fp16)
    "optimizer": "adam", "lr": 1e-6, "min-lr": 0.0, "lr-decay-style": "linear", "lr-warmup-iters": 0,
    "lr-warmup-fraction": None, "lr-warmup-init": 0.0, "lr-decay-iters": None, "weight-decay": 0.01, "adam-beta1": 0.9,
    "adam-beta2": 0.999, "adam-eps": 1e-8, "clip-grad": 1.0, "fp16": False, "bf16": False, "recompute-granularity": None,
    "loss-scale": None, "initial-loss-scale": 2.0**32, "min-loss-scale": 1.0, "loss-scale-window": 1000, "hysteresis": 2,
    "fsdp-cpu-offload": False, "optimizer-cpu-offload": False,
    "gradient-checkpointing": False,
    # LoRA (slime/utils/lora_config.py, Megatron backend)
    "use-lora": False, "lora-rank": 64, "lora-alpha": 128.0, "lora-dropout": 0.0, "lora-target-preset": None,
    "lora-target-modules": None, "lora-learning-rate": None, "lora-weight-decay": 0.0,
}

SLIME_IGNORED = re.compile(
    r"^(sglang-.*|(tensor|pipeline|context|expert)-model-parallel-size|expert-tensor-parallel-size|sequence-parallel|"
    r"recompute-(method|num-layers)|attention-(dropout|backend|softmax-in-fp32)|hidden-dropout|"
    r"accumulate-allreduce-grads-in-fp32|balance-data|rollout-num-gpus.*|num-gpus-per-node|offload.*|no-offload.*|"
    r"overlap-cpu-optimizer-d2h-h2d|use-precision-aware-optimizer|use-distributed-optimizer|"
    r"wandb-(group|team|key|host|run-id|dir|mode)|disable-wandb-random-suffix|tb-.*|log-.*|use-dynamic-batch-size|"
    r"log-probs-max-tokens-per-gpu|ref-ckpt-step|no-save-optim|no-load-.*|start-rollout-id|save-hf|"
    r"distributed-.*|train-backend|megatron-to-hf-mode|update-weight-.*|keep-old-actor|skip-eval-before-train|"
    r"rollout-skip-special-tokens|debug-.*|transformer-impl|tokenizer-.*|vocab-size|make-vocab-size-divisible-by|"
    r"num-layers|hidden-size|ffn-hidden-size|num-attention-heads|group-query-attention|num-query-groups|kv-channels|"
    r"seq-length|max-position-embeddings|position-embedding-type|rotary-.*|use-rotary-position-embeddings|"
    r"normalization|norm-epsilon|swiglu|disable-bias-linear|add-qkv-bias|qk-layernorm|"
    r"untie-embeddings-and-output-weights|num-experts|moe-.*|use-flash-attn|spec|attn-implementation|use-slime-router|"
    r"slime-router-.*|sglang-router-.*|router-.*|decoder-(first|last)-pipeline-num-layers|num-layers-per-virtual-pipeline-stage)$")
"""slime and Megatron flags with no effect on what is trained here: parallelism, offloading, the SGLang server,
logging details, the model's architecture (minirl reads it from --hf-checkpoint's config.json)."""

SLIME_RM_ARGS = ("hf-checkpoint", "reward-key", "rm-type", "rm-url", "n-samples-per-prompt", "rollout-max-response-len",
                 "input-key", "label-key", "metadata-key", "apply-chat-template")
"""The flags a translated ``--custom-rm-path`` function finds on its ``args`` (``minirl.tasks.reward_functions.SlimeArgs``)."""

RM_HUB = "minirl.tasks.slime_rewards:rm_hub"
"""slime's ``async_rm`` dispatch over its built-in ``--rm-type`` scorers (``minirl.tasks.slime_rewards.SCORERS``)."""


SLIME_TEXT = frozenset({
    "hf-checkpoint", "load", "ref-load", "save", "prompt-data", "input-key", "label-key", "metadata-key", "tool-key",
    "apply-chat-template-kwargs", "dynamic-sampling-filter-path", "rollout-stop", "rm-type", "rm-url", "custom-rm-path",
    "reward-key", "advantage-estimator", "pg-loss-type", "loss-type", "kl-loss-type", "custom-tis-function-path",
    "custom-advantage-function-path", "custom-pg-loss-reducer-function-path", "eval-prompt-data", "eval-config",
    "critic-load", "critic-save",
    "wandb-project", "optimizer", "lr-decay-style", "recompute-granularity", "lora-target-preset", "lora-target-modules",
    "custom-config-path", "train-backend"})
"""The flags the translation reads that slime's argparse takes as text (``type=str``, choices or ``json.loads``):
their values are kept as written (``--rollout-stop "yes" "[END]"`` is two strings, not a bool and a list)."""


class SlimePeer(Peer):
    """slime's settings, shown as its flags (``--use-tis``, ``--eps-clip 0.2``)."""

    def __call__(self, key: str) -> Any:
        given = self.given.get(key)
        for word in given if isinstance(given, list) else [given]:  # an nargs flag's words too
            if isinstance(word, CommandOutput):
                raise ConfigError(f"{word.where}: --{key} takes the output of {word.command}, a command the translation "
                                  f"does not run; give --{key} ... after the script")
            if isinstance(word, Unresolved) and given is not word:
                raise ConfigError(f"{word.where}: {key} uses a variable the script does not set ({word.text}); set it "
                                  f"in the environment or give --{key} ... after the script")
        value = super().__call__(key)  # a text flag's value stays text ("1" is not read as a number)
        return self.given.get(key, self.defaults.get(key)) if key in SLIME_TEXT else value

    def show(self, *keys: str) -> str:
        return ", ".join(_flag(key, self(key)) for key in keys)

    def override_hint(self, key: str) -> str:
        return f"--{key} ..."

    def number(self, key: str, cast: type[int] | type[float]) -> Any:
        """The value of ``--key`` as ``cast``; anything else is one line naming the flag."""
        try:
            return _cast_number(self(key), cast)
        except (TypeError, ValueError):
            raise ConfigError(f"slime setting {self.show(key)}: expected {'an integer' if cast is int else 'a number'}") from None


def _cast_number(value: Any, cast: type[int] | type[float]) -> Any:
    """``value`` as ``cast``; ``ValueError`` for a bool or (as an int) a fractional float, ``TypeError`` for a non-number."""
    if isinstance(value, bool) or (cast is int and isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return cast(value)


def _flag(key: str, value: Any) -> str:
    if value is True:
        return f"--{key}"
    if value is False or value is None:
        return f"--{key} unset"
    return f"--{key} {' '.join(map(str, value)) if isinstance(value, list) else value}"


MEGATRON_LOSS_SCALE = (("initial-loss-scale", "optim.loss_scale_initial", float),
                       ("loss-scale-window", "optim.loss_scale_window_updates", int),
                       ("min-loss-scale", "optim.loss_scale_min", float), ("hysteresis", "optim.loss_scale_hysteresis", int))


def _slime_precision(peer: SlimePeer, out: Translation) -> None:
    """bf16 unless ``--fp16``, whose loss scale is Megatron-LM's ``DynamicGradScaler`` (its four flags, each carried
    over; minirl's ``LossScale`` follows the same rule); a static ``--loss-scale`` becomes the initial scale, said."""
    peer("bf16")
    if not peer("fp16"):
        out.set("optim.precision", "bf16", "slime trains in bf16 (fp32 master weights) unless --fp16")
        for flag in ("loss-scale", *(flag for flag, _, _ in MEGATRON_LOSS_SCALE)):
            peer(flag)  # Megatron reads them only under --fp16
        return
    out.set("optim.precision", "fp16", peer.show("fp16") + " (Megatron-LM's dynamic loss scale)")
    for flag, key, cast in MEGATRON_LOSS_SCALE:
        out.set(key, peer.number(flag, cast), peer.show(flag))
    if peer("loss-scale") is not None:
        out.set("optim.loss_scale_initial", peer.number("loss-scale", float), peer.show("loss-scale") + " (the start)")
        out.set("optim.loss_scale_min", min(peer.number("min-loss-scale", float), peer.number("loss-scale", float)),
                peer.show("min-loss-scale") + ", at most the start")
        out.differs.append(f"{peer.show('loss-scale')}: Megatron holds this static scale and skips every update that "
                           "overflows; minirl's scale is dynamic from there (halved on an overflow, doubled after "
                           "optim.loss_scale_window_updates clean updates)")


def _slime_offload(peer: Peer, out: Translation) -> None:
    """The FSDP backend's ``--fsdp-cpu-offload`` is FSDP2's ``CPUOffloadPolicy``, as minirl's ``optim.cpu_offload``;
    Megatron's ``--optimizer-cpu-offload`` keeps only the optimizer's state (and step) on the CPU: the same offload,
    which keeps the parameters there too."""
    fsdp, optimizer = peer("fsdp-cpu-offload"), peer("optimizer-cpu-offload")
    if fsdp:
        out.set("optim.cpu_offload", True, peer.show("fsdp-cpu-offload"))
    elif optimizer:
        out.set("optim.cpu_offload", True, peer.show("optimizer-cpu-offload"))
        out.differs.append(f"{peer.show('optimizer-cpu-offload')}: Megatron keeps the optimizer's state and step on the "
                           "CPU and the parameters on the GPU; minirl's optim.cpu_offload (FSDP2's CPUOffloadPolicy) keeps "
                           "the parameters and gradients in CPU memory too, copying each layer's to the GPU for its "
                           "forward and backward")
    else:
        out.set("optim.cpu_offload", False, "slime keeps the parameters and optimizer state on the GPU unless "
                "--fsdp-cpu-offload or --optimizer-cpu-offload")

def from_slime(given: dict[str, Any], keep_objective: bool = False) -> Translation:
    """Translate slime ``train.py`` flags (names without the leading ``--``; ``$sourced``: arrays a script expands but
    does not set; ``$script``: ``train.py`` or ``train_async.py``; ``$conditional``: lines on variables a script sets
    inside a block)."""
    given = dict(given)
    sourced, script = given.pop("$sourced", []), str(given.pop("$script", "train.py"))
    custom = given.pop("$custom_config", {})  # --custom-config-path's keys: set on slime's args, as its reward reads
    conditional = given.pop("$conditional", [])
    peer, out = SlimePeer(given, SLIME_DEFAULTS), Translation("slime")
    out.differs += conditional
    if peer("rollout-batch-size") is None:
        raise ConfigError("slime setting --rollout-batch-size is missing (slime requires it: prompts per rollout)")
    if sourced:
        out.ignored.append(f"{', '.join(sourced)} (arrays the script expands but does not set: a sourced file's, such as "
                           "Megatron's model flags, which minirl reads from --hf-checkpoint's config.json, or empty ones)")
    _check_slime_refusals(peer)
    _slime_model_and_data(peer, out)
    _slime_rewards(peer, out, custom)
    n = _slime_batch(peer, out)
    _slime_optimizer(peer, out, n)
    _slime_lora(peer, out)
    _slime_runs(peer, out)
    _slime_async(peer, out, script)
    _slime_partial(peer, out)
    apply_objective(out, keep_objective, _slime_objective(peer))
    if peer("advantage-estimator") == "ppo" and not keep_objective:
        _slime_critic(peer, out)
    if peer("eps-clip-c") is not None and (peer("pg-loss-type") == "reinforce" or peer("advantage-estimator") == "cispo"):
        out.ignored.append(f"--eps-clip-c (no dual clip in slime's {'REINFORCE' if peer('pg-loss-type') == 'reinforce' else 'CISPO'} "
                           "loss: it has no effect there)")
    _slime_cluster(peer, out)
    peer("custom-config-path")  # read before the translation (read_slime): its keys are among the flags
    if custom and peer("custom-rm-path"):  # on the reward function's args: read, whatever minirl makes of them
        peer.read |= {key.replace("_", "-") for key in custom}
    leftovers(peer, out, SLIME_IGNORED, prefix="--")
    return out


SLIME_REFUSALS = (
    (lambda peer: peer("use-rollout-logprobs") and peer("use-tis") and peer("pg-loss-type") != "reinforce",
     "use_rollout_logprobs and use_tis cannot be set at the same time"),
    (lambda peer: peer("kl-coef") and peer("kl-loss-coef"), "only one of kl_coef and kl_loss_coef can be set"),
    (lambda peer: peer("advantage-estimator") in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
     and not peer("normalize-advantages"),
     "the reinforce_plus_plus and reinforce_plus_plus_baseline advantage estimators require --normalize-advantages"),
    (lambda peer: peer("eval-interval") and not (peer("eval-prompt-data") or peer("eval-config")),
     "evaluation datasets must be configured when --eval-interval is set (--eval-prompt-data or --eval-config)"),
)
"""Combinations slime's ``slime_validate_args`` asserts against: refused here too, in its words."""


def _check_slime_refusals(peer: SlimePeer) -> None:
    for refused, why in SLIME_REFUSALS:
        if refused(peer):
            raise ConfigError(f"slime refuses these settings: {why}")


def _slime_model_and_data(peer: SlimePeer, out: Translation) -> None:
    if peer("hf-checkpoint"):
        out.set("model.path", peer("hf-checkpoint"), peer.show("hf-checkpoint"))
        note_local_path(out, "--hf-checkpoint", peer("hf-checkpoint"), "model")
    data = peer("prompt-data")
    if data:
        path, rows = _row_slice(str(data))
        out.set("task.kind", "jsonl", "--prompt-data given")
        out.set("task.path", path, peer.show("prompt-data"))
        note_local_path(out, "--prompt-data", path, "data")
        if rows:
            out.not_translated.append(f"--prompt-data {data}: the row slice {str(data)[len(path):]} (give minirl a file "
                                      "of those rows)")
    out.set("task.prompt_column", peer("input-key"), peer.show("input-key"))
    if peer("label-key"):
        out.set("task.answer_column", peer("label-key"), peer.show("label-key"))
        if data:
            check_label_column("--label-key", str(peer("label-key")), _row_slice(str(data))[0], "slime")
    if peer("apply-chat-template"):  # a text prompt as one user message, then the template (slime's data.py)
        out.set("task.chat_prompts", True, peer.show("apply-chat-template"))
    else:
        out.set("task.chat_template", "plain", peer.show("apply-chat-template") + " (prompts as plain text)")
    template_kwargs(peer, out, "apply-chat-template-kwargs")
    if peer("rollout-max-prompt-len"):
        out.set("task.max_prompt_tokens", peer.number("rollout-max-prompt-len", int), peer.show("rollout-max-prompt-len"))
        out.set("task.on_bad_row", "skip", peer.show("rollout-max-prompt-len") + " (slime drops longer prompts)")
    if peer("rollout-stop"):
        stops = peer("rollout-stop")
        out.set("task.stop_strings", [str(s) for s in stops] if isinstance(stops, list) else [str(stops)],
                peer.show("rollout-stop"))
    peer("metadata-key")  # its column reaches minirl's reward functions as a keyword, as every other column
    if peer("tool-key") != "tools":  # the schemas slime renders into a row's prompt; minirl reads a "tools" column
        out.not_translated.append(f"{peer.show('tool-key')}: minirl renders a row's tool schemas from its 'tools' "
                                  "column: rename the column (the functions themselves: task.tools)")
    if data and not (peer("eval-prompt-data") or peer("eval-config")):
        out.differs.append("no --eval-prompt-data: minirl evaluates before and after training on task.eval_fraction (10%) "
                           "of the training rows, held out; slime trains on all of them (give task.eval_path to keep "
                           "every row for training)")
    if data and not peer("rollout-shuffle"):
        out.differs.append("--rollout-shuffle unset: slime takes the prompts in the file's order, minirl in a seeded "
                           "shuffle of them each epoch")


def _row_slice(data: str) -> tuple[str, slice | None]:
    """``path@[start:end]`` as slime's ``_parse_generalized_path`` reads it: only a trailing slice is one."""
    match = re.fullmatch(r"(.*)@\[(-?\d*):(-?\d*)\]", data, re.S)
    if match is None:
        return data, None
    start, end = (int(x) if x else None for x in match.group(2, 3))
    return match.group(1), slice(start, end)


def _slime_rewards(peer: SlimePeer, out: Translation, settings: dict[str, Any]) -> None:
    """``--custom-rm-path module.function`` (called as slime calls it: ``minirl.tasks.reward_functions``; ``settings``:
    ``--custom-config-path``'s keys, on its ``args`` too) or a built-in ``--rm-type``."""
    custom, kind = peer("custom-rm-path"), peer("rm-type")
    if custom:
        module, _, name = str(custom).rpartition(".")
        entry: dict[str, Any] = {"function": f"{module}:{name}", "convention": "slime"}
        if peer("group-rm"):
            entry["batched"] = True
        args = {key.replace("-", "_"): peer(key) for key in SLIME_RM_ARGS if peer(key) is not None}
        args |= settings  # as slime's setattr(args, key, value), under the YAML's own names
        if args:  # what a slime reward function reads from its args
            entry["kwargs"] = args
        out.set("task.reward_functions", [entry], peer.show("custom-rm-path", "group-rm"))
        if settings:
            out.differs.append(f"{peer.show('custom-config-path')}: its keys ({', '.join(settings)}) are on the reward "
                               "function's args, as slime sets them; those that are slime flags are translated as flags")
        if peer("group-rm"):
            out.differs.append(f"{peer.show('group-rm')}: the function gets each prompt's group of samples in a call, as "
                               "slime's; the groups' calls are awaited together")
        out.set("task.reward_timeout_s", None, peer.show("custom-rm-path") + " (slime sets no time limit on a reward call)")
        out.differs.append(f"{peer.show('custom-rm-path')}: no time limit on a reward call, as in slime "
                           "(task.reward_timeout_s: null; it runs in the trainer's process, an async def's samples "
                           "awaited together): give seconds to have a call that hangs killed")
        out.differs.append(f"{peer.show('custom-rm-path')}: minirl calls it with slime's (args, sample); sample.prompt "
                           "is the row's prompt as written (a chat stays a list of messages, not the templated text) and "
                           "args holds the flags a reward function reads (hf_checkpoint, reward_key, rm_type, ...)")
    elif str(kind).removeprefix("boxed_") in (*SCORERS, "remote_rm"):
        keys = ("rm-type", "reward-key", "metadata-key", "rm-url")
        args = {key.replace("-", "_"): peer(key) for key in keys if peer(key) is not None}
        if str(kind).removeprefix("boxed_") == "remote_rm":
            if not peer("rm-url"):
                raise ConfigError(f"{peer.show('rm-type')} needs --rm-url: the reward server each response is posted to")
            _remote_rm_budget(args, out, peer.show("rm-type", "rm-url"))
        out.set("task.reward_functions", [{"function": RM_HUB, "kwargs": args}], peer.show("rm-type"))
        if str(kind).removeprefix("boxed_") in ("math", "deepscaler"):
            out.differs.append(f"{peer.show('rm-type')}: the boxed answer is graded with math-verify here, not "
                               "DeepScaleR's mathd + sympy rules (the same on numbers and most LaTeX)")
    elif kind:
        out.not_translated.append(f"{peer.show('rm-type')}: minirl has slime's {', '.join(SCORERS)} and remote_rm scorers "
                                  "(and their boxed_ forms); write this one as a reward function (task.reward_function)")
    else:  # slime's async_rm: each row's metadata rm_type, as the built-in dispatch reads it first
        args = {key.replace("-", "_"): peer(key) for key in ("reward-key", "metadata-key", "rm-url")
                if peer(key) is not None}
        if peer("rm-url"):  # a row's rm_type may be remote_rm
            _remote_rm_budget(args, out, peer.show("rm-url"))
        out.set("task.reward_functions", [{"function": RM_HUB, "kwargs": args}], peer.show("rm-type", "custom-rm-path"))
        out.differs.append(f"no --rm-type or --custom-rm-path: each row's {peer('metadata-key')}.rm_type picks its scorer "
                           "(slime's async_rm), as translated; a row without one stops the run with one line")


def _remote_rm_budget(args: dict[str, Any], out: Translation, origin: str) -> None:
    """slime retries a reward server that fails for minutes; minirl's runner kills a reward call past
    ``task.reward_timeout_s`` (10 s by default) with a line that does not say why. ``remote_rm`` gets a budget
    (``rm_deadline_s``) holding slime's 10 tries of a request that fails at once or one 120 s request, and the timeout
    is set above it: a dead server is one line naming its URL and ``--rm-url``, a slow or restarting one is waited for."""
    args["rm_deadline_s"] = SLIME_RM_DEADLINE_S
    out.set("task.reward_timeout_s", SLIME_RM_TIMEOUT_S, f"{origin}: over remote_rm's rm_deadline_s")
    out.differs.append(f"{origin}: remote_rm tries one response for at most {SLIME_RM_DEADLINE_S:g} s (its kwargs "
                       "rm_deadline_s: slime's 10 tries when a request fails at once, or one 120 s request), then fails "
                       "with one line naming the server and --rm-url; slime goes on, up to 10 requests of 120 s. "
                       "task.reward_timeout_s is set above it: raise the two together")


def _slime_batch(peer: SlimePeer, out: Translation) -> int:
    """Rollout size, sampling, and N: the optimizer steps per rollout (samples / ``--global-batch-size``)."""
    prompts, group = peer.number("rollout-batch-size", int), peer.number("n-samples-per-prompt", int)
    samples = prompts * group
    out.set("rollout.prompts_per_step", prompts, peer.show("rollout-batch-size"))
    out.set("rollout.samples_per_prompt", group, peer.show("n-samples-per-prompt"))
    batch = peer.number("global-batch-size", int) if peer("global-batch-size") is not None else None
    steps = peer.number("num-steps-per-rollout", int) if peer("num-steps-per-rollout") is not None else None
    if steps and batch and batch != samples // steps:
        raise ConfigError(f"slime settings {peer.show('num-steps-per-rollout', 'global-batch-size')}: they disagree "
                          f"({samples} samples // {steps} steps = {samples // steps}; slime asserts they agree); give one")
    if steps:
        n, origin = steps, peer.show("num-steps-per-rollout")
    elif batch:
        if samples % batch:
            raise ConfigError(f"slime settings {peer.show('rollout-batch-size', 'n-samples-per-prompt', 'global-batch-size')}: "
                              "the global batch must divide the rollout's samples")
        n, origin = samples // batch, f"{samples} samples / {peer.show('global-batch-size')}"
    else:  # Megatron's default: micro-batch size x data-parallel ranks
        ranks = _data_parallel(peer)
        size = peer.number("micro-batch-size", int) * ranks
        if samples % size:
            raise ConfigError(f"slime settings {peer.show('rollout-batch-size', 'n-samples-per-prompt')} without "
                              f"--global-batch-size: Megatron's default batch ({size} = micro-batch x {ranks} data-parallel "
                              "ranks) must divide the rollout's samples; give --global-batch-size")
        n, origin = samples // size, f"no --global-batch-size: Megatron's micro-batch x data-parallel ranks = {size}"
    out.set("optim.minibatches_per_step", n, origin)
    out.set("optim.epochs_per_step", 1, "slime trains one pass over each rollout")
    if peer("use-dynamic-batch-size") and peer("max-tokens-per-gpu"):
        out.set("optim.micro_batch_max_tokens", peer.number("max-tokens-per-gpu", int),
                peer.show("use-dynamic-batch-size", "max-tokens-per-gpu"))
    elif peer.set_by_user("micro-batch-size"):  # slime's default 1 is a GPU memory setting: minirl's own default here
        out.set("optim.micro_batch_sequences", peer.number("micro-batch-size", int), peer.show("micro-batch-size"))
    if peer("rollout-max-response-len"):
        out.set("rollout.max_new_tokens", peer.number("rollout-max-response-len", int), peer.show("rollout-max-response-len"))
    else:
        out.not_translated.append("--rollout-max-response-len unset (SGLang's default); set rollout.max_new_tokens")
    out.set("rollout.temperature", peer.number("rollout-temperature", float), peer.show("rollout-temperature"))
    out.set("rollout.top_p", peer.number("rollout-top-p", float), peer.show("rollout-top-p"))
    out.set("rollout.top_k", max(0, peer.number("rollout-top-k", int)), peer.show("rollout-top-k"))
    _slime_dynamic_sampling(peer, out, prompts)
    return n


def _slime_async(peer: SlimePeer, out: Translation, script: str) -> None:
    """``train_async.py`` samples rollout k + 1 while training on rollout k, on the weights before that step: minirl's
    one-step-off ``rollout.async_steps: 1``. ``--update-weights-interval`` k > 1 leaves the engine's weights 1 to k
    steps old, step by step; minirl's ``async_steps: k`` is a fixed lag of k, so it is not translated."""
    interval = peer.number("update-weights-interval", int)
    if interval != 1:
        out.not_translated.append(f"{peer.show('update-weights-interval')}: minirl syncs the engine's weights after "
                                  "every step; rollout.async_steps: k keeps every batch exactly k steps stale, where "
                                  "slime's lag moves between 1 and the interval")
    if script.startswith("train_async"):
        out.set("rollout.async_steps", 1, f"{script}: the next rollout beside this step's training, one step stale")


def _slime_partial(peer: SlimePeer, out: Translation) -> None:
    """``--partial-rollout``: the unfinished responses of a rollout stopped once its batch was full go back to the
    buffer and continue in the next rollout, on the new weights: ``rollout.partial_rollout``, with its
    ``--over-sampling-batch-size`` (prompts drawn at a time) and ``--mask-offpolicy-in-partial-rollout``. Under
    ``train_async.py`` the pool is sampled beside the update (``rollout.async_steps: 1``), as slime's is."""
    mask = peer("mask-offpolicy-in-partial-rollout")
    if not peer("partial-rollout"):
        return
    out.set("rollout.partial_rollout", True, peer.show("partial-rollout"))
    prompts = peer.number("rollout-batch-size", int)
    over = peer.number("over-sampling-batch-size", int) if peer("over-sampling-batch-size") else prompts
    out.set("rollout.partial_pool_prompts", max(over, prompts), peer.show("over-sampling-batch-size") + " (prompts drawn at "
            "a time; unset: --rollout-batch-size)")
    out.set("rollout.partial_mask_stale", bool(mask), peer.show("mask-offpolicy-in-partial-rollout"))
    out.differs.append("--partial-rollout: slime aborts the requests still running the moment its batch is full; "
                       "minirl checks every rollout.partial_chunk_tokens new tokens per response (the native engine inside "
                       "one call; other engines a call per chunk, each prefilling the responses so far again); both drop "
                       "groups that ended beyond the batch")


def _data_parallel(peer: SlimePeer) -> int:
    gpus = peer.number("actor-num-nodes", int) * peer.number("actor-num-gpus-per-node", int)
    split = peer.number("tensor-model-parallel-size", int) * peer.number("pipeline-model-parallel-size", int) * peer.number("context-parallel-size", int)
    return max(gpus // max(split, 1), 1)


def _slime_dynamic_sampling(peer: SlimePeer, out: Translation, prompts: int) -> None:
    """DAPO's filter: slime's ``check_reward_nonzero_std`` keeps groups whose rewards differ, sampling
    ``--over-sampling-batch-size`` prompts at a time until the rollout is full."""
    path = peer("dynamic-sampling-filter-path")
    if not path:
        return
    if not str(path).endswith("check_reward_nonzero_std"):
        out.not_translated.append(f"{peer.show('dynamic-sampling-filter-path')}: minirl's rollout.filter_groups keeps "
                                  "groups whose rewards differ (slime's check_reward_nonzero_std) only")
        return
    out.set("rollout.filter_groups", True, peer.show("dynamic-sampling-filter-path"))
    out.set("rollout.filter_groups_metric", "reward", "check_reward_nonzero_std: the rewards' spread")
    if peer("over-sampling-batch-size") and peer.number("over-sampling-batch-size", int) != prompts:
        out.set("rollout.filter_groups_prompts_per_round", peer.number("over-sampling-batch-size", int),
                peer.show("over-sampling-batch-size"))
    out.differs.append(f"{peer.show('dynamic-sampling-filter-path')}: slime samples until the rollout is full; minirl "
                       "stops after rollout.filter_groups_max_rounds rounds and fills it with zero-spread groups")


def _slime_optimizer(peer: SlimePeer, out: Translation, n: int) -> None:
    """Megatron's Adam (decoupled weight decay: AdamW) and its schedule, in optimizer steps (minirl's updates)."""
    if peer("optimizer") != "adam":
        out.not_translated.append(f"{peer.show('optimizer')}: minirl trains with AdamW")
    lr = peer.number("lr", float)
    out.set("optim.lr", lr, peer.show("lr"))
    out.set("optim.weight_decay", peer.number("weight-decay", float), peer.show("weight-decay"))
    out.set("optim.adam_beta1", peer.number("adam-beta1", float), peer.show("adam-beta1"))
    out.set("optim.adam_beta2", peer.number("adam-beta2", float), peer.show("adam-beta2"))
    out.set("optim.adam_eps", peer.number("adam-eps", float), peer.show("adam-eps"))
    out.set("optim.grad_clip_norm", peer.number("clip-grad", float), peer.show("clip-grad"))
    rollouts = _slime_rollouts(peer, out)
    style = peer("lr-decay-style")
    if style in ("constant", "linear", "cosine"):
        out.set("optim.lr_schedule", style, peer.show("lr-decay-style"))
        if style != "constant":
            out.set("optim.min_lr_ratio", peer.number("min-lr", float) / lr if lr else 0.0, peer.show("min-lr", "lr"))
            if peer("lr-decay-iters") is not None:
                out.differs.append(f"{peer.show('lr-decay-iters')}: minirl decays over the whole run")
    else:
        out.not_translated.append(f"{peer.show('lr-decay-style')}: minirl's optim.lr_schedule is constant, linear or cosine")
    if peer("lr-warmup-fraction"):  # Megatron: the fraction of --lr-decay-iters (default the run's optimizer steps)
        fraction = peer.number("lr-warmup-fraction", float)
        if peer("lr-decay-iters") is not None:
            out.set("optim.warmup_updates", round(fraction * peer.number("lr-decay-iters", int)),
                    peer.show("lr-warmup-fraction", "lr-decay-iters") + " (optimizer steps)")
        elif rollouts:
            out.set("optim.warmup_updates", round(fraction * rollouts * n),
                    f"{peer.show('lr-warmup-fraction')} x {rollouts * n} optimizer steps")
        else:
            out.not_translated.append(f"{peer.show('lr-warmup-fraction')}: the run's length is not known here, so the "
                                      "warm-up is not translated (set optim.warmup_updates)")
    elif peer("lr-warmup-iters"):
        out.set("optim.warmup_updates", peer.number("lr-warmup-iters", int), peer.show("lr-warmup-iters"))
    if out.values.get("optim.warmup_updates"):
        out.differs.append("the warm-up: Megatron's starts at --lr-warmup-init (update k at k/W of the rate), minirl's "
                           "at 1/W ((k + 1)/W)")
    _slime_precision(peer, out)
    for key in ("recompute-granularity", "gradient-checkpointing"):  # Megatron's, slime's FSDP backend's
        if peer(key):
            out.set("optim.gradient_checkpointing", True, peer.show(key))
    _slime_offload(peer, out)
    for key, mode in (("use-rollout-routing-replay", "R3"), ("use-routing-replay", "R2")):
        if peer(key):
            out.set("moe.routing_replay", mode, peer.show(key))
            break


SLIME_LORA_PRESETS = {"dense_attention": ["linear_qkv", "linear_proj"], "moe_attention": ["linear_qkv", "linear_proj"],
                      "dense_mlp": ["linear_fc1", "linear_fc2"],
                      "dense_language": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                      "moe_shared_mlp": ["shared"], "moe_routed_experts": ["routed"], "moe_mlp": ["shared", "routed"],
                      "moe_language": ["linear_qkv", "linear_proj", "shared"],
                      "moe_language_all": ["linear_qkv", "linear_proj", "shared", "routed"]}
"""slime's LoRA target presets as Megatron projections (``MEGATRON_MODULES`` names them in transformers' words), the
shared experts' projections (``SHARED_EXPERTS``) and the routed experts' fused tensors (``ROUTED_EXPERTS``, peft's
``target_parameters``); the hybrid-attention presets have no form here."""

SHARED_EXPERTS = [f"{block}.{proj}" for block in ("shared_expert", "shared_experts")
                  for proj in ("gate_proj", "up_proj", "down_proj")]
"""A shared expert's projections in transformers (Qwen2-MoE's ``shared_expert``, DeepSeek's ``shared_experts``)."""
ROUTED_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
"""The routed experts' fused tensors in transformers 5 (``model.lora.target_parameters``)."""


def _slime_lora(peer: SlimePeer, out: Translation) -> None:
    """``--use-lora``: rank, alpha, dropout, the targets (a preset, default ``dense_language``, or Megatron regexes),
    and slime's LoRA learning rate and weight decay, which replace ``--lr`` and ``--weight-decay``."""
    if not peer("use-lora"):
        return
    explicit = peer("lora-target-modules")
    if explicit:
        patterns = [str(p) for p in (explicit if isinstance(explicit, list) else [explicit])]
        megatron = [name for name in MEGATRON_MODULES if any(name in p for p in patterns)]
        rest = [p for p in patterns if not any(name in p for name in MEGATRON_MODULES)]
        origin = peer.show("lora-target-modules")
        if rest:
            out.not_translated.append(f"--lora-target-modules {' '.join(rest)} (modules minirl cannot map)")
    else:
        preset = str(peer("lora-target-preset") or "dense_language")
        megatron, origin = SLIME_LORA_PRESETS.get(preset, []), peer.show("lora-target-preset") + f" ({preset})"
        if preset not in SLIME_LORA_PRESETS:
            out.not_translated.append(f"--lora-target-preset {preset}: its modules (linear attention) have no LoRA "
                                      "form here")
        elif "routed" in megatron:
            out.differs.append(f"--lora-target-preset {preset}: one adapter per routed expert (peft's), where slime "
                               "shares one adapter among an MoE layer's experts")
        elif "linear_fc1" in megatron:  # peft (>= 0.17) maps these names onto transformers 5's fused expert tensors
            out.differs.append(f"--lora-target-preset {preset}: on an MoE checkpoint peft also adapts the routed "
                               "experts under gate_proj / up_proj / down_proj, where slime's dense MLP targets match "
                               "no expert (--lora-target-preset moe_language: attention and shared experts alone)")
    if not megatron:
        return
    out.set("model.lora.rank", peer.number("lora-rank", int), peer.show("lora-rank"))
    out.set("model.lora.alpha", peer.number("lora-alpha", float), peer.show("lora-alpha"))
    out.set("model.lora.dropout", peer.number("lora-dropout", float), peer.show("lora-dropout"))
    modules = [hf for name in megatron for hf in (SHARED_EXPERTS if name == "shared" else MEGATRON_MODULES.get(name, []))]
    out.set("model.lora.target_modules", modules, origin)
    if "routed" in megatron:
        out.set("model.lora.target_parameters", ROUTED_EXPERTS, origin)
    if peer("lora-learning-rate") is not None:
        out.set("optim.lr", peer.number("lora-learning-rate", float), peer.show("lora-learning-rate"))
    out.set("optim.weight_decay", peer.number("lora-weight-decay", float),
            peer.show("lora-weight-decay") + " (slime's LoRA weight decay replaces --weight-decay)")


def _slime_rollouts(peer: SlimePeer, out: Translation) -> int | None:
    """``--num-rollout`` (or ``--num-epoch`` x the training rows // ``--rollout-batch-size``) as global steps."""
    if peer("num-rollout"):
        out.set("optim.global_steps", peer.number("num-rollout", int), peer.show("num-rollout"))
        return peer.number("num-rollout", int)
    rows = count_rows(out.values.get("task.path"))
    epochs, prompts = peer("num-epoch"), peer.number("rollout-batch-size", int)
    if epochs and rows is not None:
        sliced = _row_slice(str(peer("prompt-data")))[1]
        rows = len(range(rows)[sliced]) if sliced else rows  # slime counts the slice's rows
        steps = peer.number("num-epoch", int) * (rows // prompts)
        out.set("optim.global_steps", steps, f"{peer.show('num-epoch')} x ({rows} rows // {prompts})")
        if peer("rollout-max-prompt-len"):
            out.differs.append(f"{peer.show('num-epoch', 'rollout-max-prompt-len')}: slime counts the rows left after "
                               "dropping longer prompts, so its run is shorter by those; minirl's optim.global_steps "
                               "counts them all")
        return steps
    out.not_translated.append("--num-rollout / --num-epoch: set optim.global_steps (rollouts to train)")
    return None


def _slime_runs(peer: SlimePeer, out: Translation) -> None:
    save = peer("save")
    if save:
        path = Path(str(save).rstrip("/"))
        out.set("run.output_dir", str(path.parent), peer.show("save"))
        out.set("run.name", path.name, peer.show("save"))
    interval = peer("save-interval")
    out.set("checkpoint.every_steps", peer.number("save-interval", int) if save and interval else 0,
            peer.show("save", "save-interval"))
    load = peer("load")
    out.set("run.resume", "auto" if load and save and str(load).rstrip("/") == str(save).rstrip("/") else "never",
            peer.show("load"))
    if load and str(load).rstrip("/") != str(save or "").rstrip("/"):
        out.differs.append(f"{peer.show('load')}: a Megatron checkpoint; minirl starts from --hf-checkpoint "
                           "(resume a minirl run with run.resume=auto in its own directory)")
    if peer("ref-load"):
        _slime_ref_load(peer, out, str(peer("ref-load")), str(load or ""))
    if peer("rollout-seed") != SLIME_DEFAULTS["rollout-seed"] or peer("seed") != SLIME_DEFAULTS["seed"]:
        key = "rollout-seed" if peer("rollout-seed") != SLIME_DEFAULTS["rollout-seed"] else "seed"
        out.set("run.seed", peer.number(key, int), peer.show("rollout-seed", "seed"))
    _slime_eval(peer, out)
    if peer("use-wandb"):
        out.set("log.wandb", True, peer.show("use-wandb"))
        if peer("wandb-project"):
            out.set("log.wandb_project", str(peer("wandb-project")), peer.show("wandb-project"))
    if peer("use-tensorboard"):
        out.set("log.tensorboard", True, peer.show("use-tensorboard"))


def _slime_ref_load(peer: SlimePeer, out: Translation, ref: str, load: str) -> None:
    """slime trains from ``--ref-load`` while ``--load`` holds no checkpoint (``slime_validate_args``: ``load =
    ref_load`` unless --load is a Megatron or HF checkpoint), and takes it as the KL reference: minirl's starting
    weights, which are its reference. An HF directory here is model.path; a Megatron one minirl cannot read (said)."""
    here, loaded = Path(os.path.expanduser(ref)), Path(os.path.expanduser(load))
    if load and any((loaded / name).exists() for name in ("latest_checkpointed_iteration.txt", "config.json")):
        out.differs.append(f"{peer.show('ref-load')}: slime's KL reference (training starts from --load); minirl's "
                           "reference is its starting weights")
    elif (here / "config.json").exists() and not (here / "latest_checkpointed_iteration.txt").exists():
        out.set("model.path", ref, peer.show("ref-load") + ": slime trains from it while --load holds no checkpoint")
        if peer("hf-checkpoint") and str(peer("hf-checkpoint")).rstrip("/") != ref.rstrip("/"):
            out.differs.append(f"{peer.show('hf-checkpoint')}: slime's tokenizer; minirl reads the tokenizer from "
                               "model.path (--ref-load) too")
    else:
        start = f"--hf-checkpoint {peer('hf-checkpoint')}" if peer("hf-checkpoint") else "model.path"
        out.not_translated.append(f"{peer.show('ref-load')}: slime trains from it while --load holds no checkpoint (and "
                                  f"takes it as the KL reference); minirl cannot read a Megatron checkpoint and starts "
                                  f"from {start} (the same weights if --ref-load is its conversion; else set model.path "
                                  "to --ref-load in HF format)")


SLIME_EVAL_LAW = (("eval.samples_per_prompt", "n_samples_per_eval_prompt", ("n-samples-per-eval-prompt",), int),
                  ("eval.temperature", "temperature", ("eval-temperature", "rollout-temperature"), float),
                  ("eval.top_p", "top_p", ("eval-top-p", "rollout-top-p"), float),
                  ("eval.top_k", "top_k", ("eval-top-k", "rollout-top-k"), int),
                  ("eval.max_new_tokens", "max_response_len", ("eval-max-response-len", "rollout-max-response-len"), int))
"""minirl's eval law, slime's ``--eval-config`` field for it and the flags it falls back to, in order."""


def _slime_eval(peer: SlimePeer, out: Translation) -> None:
    """``--eval-config FILE`` (slime's ``eval.datasets``, each with ``eval.defaults`` and then the flags below filling
    what it leaves unset) or ``--eval-prompt-data name path [name path ...]`` (one path alone: slime's "aime"), and the
    ``--eval-*`` law, each falling back to the rollout's."""
    datasets = _slime_eval_datasets(peer, out)
    data = peer("eval-prompt-data")
    if datasets:
        paths, origin, flag = [str(d["path"]) for d in datasets], peer.show("eval-config"), "--eval-config"
        if data:
            out.differs.append(f"{peer.show('eval-prompt-data')}: left for --eval-config's datasets")
    elif data:
        words = [str(w) for w in (data if isinstance(data, list) else [data])]
        paths, origin, flag = (words[1::2] if len(words) > 1 else words), peer.show("eval-prompt-data"), "--eval-prompt-data"
    if datasets or data:
        out.set("task.eval_path", paths[0] if len(paths) == 1 else paths, origin)
        for path in paths:
            note_local_path(out, flag, path, "eval data", "task.eval_path")
        if len(paths) > 1:
            out.differs.append(f"{origin}: minirl evaluates their rows together (eval/<data_source>/accuracy splits them "
                               "when the rows carry a data_source column)")
    interval = peer("eval-interval")
    out.set("eval.every_steps", peer.number("eval-interval", int) if interval and (data or datasets) else 0,
            peer.show("eval-interval"))
    for ours, field, flags, cast in SLIME_EVAL_LAW:
        key = next((flag for flag in flags if peer(flag) is not None), None)
        flag_value = None if key is None else peer.number(key, cast)
        value, origin = flag_value, "" if key is None else peer.show(key)
        if datasets:
            values = {str(d["name"]): d.get(field, flag_value) for d in datasets}
            if len(set(map(str, values.values()))) > 1:
                out.not_translated.append(f"--eval-config's {field} differs between datasets ({_listed(values)}): minirl "
                                          f"evaluates them with one {ours}")
            elif any(field in d for d in datasets):
                given = next(d[field] for d in datasets if field in d)
                value, origin = _eval_number(peer, given, field, cast), f"{peer.show('eval-config')}: {field}"
        if value is not None:
            out.set(ours, max(value, 0) if ours == "eval.top_k" else value, origin)


def _slime_eval_datasets(peer: SlimePeer, out: Translation) -> list[dict[str, Any]] | None:
    """``--eval-config``'s datasets (a list, or a mapping by name), each with ``eval.defaults`` filling what it leaves
    unset (slime's ``apply_defaults``); what minirl cannot take per dataset is listed as not translated. None when
    there is no file, or it is not on this machine (listed)."""
    path = peer("eval-config")
    if not path:
        return None
    if not Path(os.path.expanduser(str(path))).exists():
        out.not_translated.append(f"{peer.show('eval-config')}: not on this machine, so its datasets are not read "
                                  "(set task.eval_path and eval.*)")
        return None
    raw = read_yaml(os.path.expanduser(str(path)))
    section = raw.get("eval", raw)
    entries = section.get("datasets") if isinstance(section, dict) else None
    if isinstance(entries, dict):
        entries = [{"name": name, **(cfg or {})} for name, cfg in entries.items()]
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) and e.get("name") and e.get("path")
                                                                for e in entries):
        raise ConfigError(f"slime setting {peer.show('eval-config')}: expected eval.datasets, a list (or mapping) of "
                          "datasets each with a name and a path")
    defaults = section.get("defaults") or {}
    datasets = [{**defaults, **{k: v for k, v in e.items() if v not in (None, [], {})}} for e in entries]
    columns = {"prompt_key": peer("input-key"), "label_key": peer("label-key"), "metadata_key": peer("metadata-key"),
               "rm_type": peer("rm-type") if not peer("custom-rm-path") else None}
    for d in datasets:
        for field, training in columns.items():
            if d.get(field) is not None and d[field] != training:
                what = ("its scorer (minirl scores held-out rows with the training reward; a row's metadata.rm_type "
                        "still picks its own)") if field == "rm_type" else "its column (minirl reads the training's)"
                out.not_translated.append(f"--eval-config dataset {d['name']}: {field} {d[field]!r}, {what}")
        for field in ("tool_key", "metadata_overrides", "stop", "stop_token_ids", "min_new_tokens"):
            if d.get(field) not in (None, [], {}):
                out.not_translated.append(f"--eval-config dataset {d['name']}: {field} {d[field]!r}")
    return datasets


def _eval_number(peer: SlimePeer, value: Any, field: str, cast: type[int] | type[float]) -> Any:
    try:
        return _cast_number(value, cast)
    except (TypeError, ValueError):
        raise ConfigError(f"slime setting {peer.show('eval-config')}: {field} {value!r} is not "
                          f"{'an integer' if cast is int else 'a number'}") from None


def _listed(values: dict[str, Any]) -> str:
    return ", ".join(f"{name} {value}" for name, value in values.items())


def _slime_cluster(peer: SlimePeer, out: Translation) -> None:
    """The actor's GPUs as FSDP2 trainer ranks, one per GPU (slime's Megatron splits them by its parallel sizes)."""
    ranks = peer.number("actor-num-nodes", int) * peer.number("actor-num-gpus-per-node", int)
    peer("colocate")
    gpu_ranks(out, ranks, peer.show("actor-num-nodes", "actor-num-gpus-per-node"), "slime",
              "(Megatron's parallel sizes, or FSDP) next to SGLang")


SLIME_KL_KINDS = {"k1": "k1", "k2": "k2", "k3": "k3", "low_var_kl": "k3"}


def _slime_objective(peer: SlimePeer) -> Objective:
    """slime's loss as algo.* values, or why not."""
    obj = Objective()
    estimator, pg = peer("advantage-estimator"), peer("pg-loss-type")
    if peer("loss-type") != "policy_loss" or peer("custom-advantage-function-path") or peer("custom-pg-loss-reducer-function-path"):
        obj.blockers.append(peer.show("loss-type") + " or a custom advantage / loss reducer")
        return obj
    _slime_advantage(peer, obj, estimator)
    per_token = bool(peer("calculate-per-token-loss"))
    if pg == "reinforce":
        _slime_reinforce(peer, obj, per_token)
    elif estimator == "gspo":  # each sample's (constant) token loss, the mean over samples: GSPO's Eq. (5)
        obj.set("name", "gspo", peer.show("advantage-estimator"))
        if per_token:  # |y_i| x each sample's loss over the step's tokens: no minirl GSPO divides so
            obj.blockers.append(peer.show("advantage-estimator", "calculate-per-token-loss"))
    elif estimator == "cispo":
        obj.set("name", "cispo", peer.show("advantage-estimator"))
        if not per_token:  # slime's per-sample token mean; minirl's CISPO divides by the group's or batch's tokens
            obj.blockers.append(peer.show("advantage-estimator", "calculate-per-token-loss"))
        obj.set("aggregation", "token_mean", peer.show("calculate-per-token-loss"))
    elif per_token:  # PPO's min(r A, clip(r) A) as MiniRL's clip mask with the weight pi_theta/pi_old
        obj.set("name", "minirl", peer.show("calculate-per-token-loss") + ": PPO's clip, one token mean")
        obj.set("clip", True, "PPO's min(r A, clip(r) A): a token mask")
        obj.set("aggregation", "token_mean", peer.show("calculate-per-token-loss"))
        obj.set("tis_placement", "train_infer", "w = clamp(pi_old/mu_old) x pi_theta/pi_old: slime's weight")
    else:
        obj.set("name", "grpo", peer.show("calculate-per-token-loss") + ": PPO's clip, each sample's token mean")
    if pg != "reinforce":
        obj.set("eps_low", peer.number("eps-clip", float), peer.show("eps-clip"))
        high = "eps-clip-high" if peer("eps-clip-high") is not None else "eps-clip"
        obj.set("eps_high", peer.number(high, float), peer.show(high))
    if peer("eps-clip-c") is not None:
        if obj.values.get("algo.name", (None,))[0] in ("grpo", "minirl") and pg != "reinforce":
            obj.set("dual_clip", peer.number("eps-clip-c", float), peer.show("eps-clip-c"))
        elif pg != "reinforce" and estimator != "cispo":  # slime's REINFORCE and CISPO losses never read it (ignored)
            obj.blockers.append(peer.show("eps-clip-c", "advantage-estimator"))
    _slime_corrections(peer, obj)
    _slime_penalties(peer, obj)
    return obj


def _slime_reinforce(peer: SlimePeer, obj: Objective, per_token: bool) -> None:
    """``--pg-loss-type reinforce``: -A log pi_theta with no ratio: MiniRL's Eq. (7) unclipped, no pi_theta/pi_old."""
    origin = peer.show("pg-loss-type")
    obj.set("name", "minirl", origin + ": REINFORCE, MiniRL's Eq. (7) unclipped")
    obj.set("clip", False, origin + " (no clipping)")
    obj.set("staleness_weight", False, origin + ": no pi_theta/pi_old")
    obj.set("aggregation", "token_mean" if per_token else "seq_mean", peer.show("calculate-per-token-loss"))


def _slime_advantage(peer: SlimePeer, obj: Objective, estimator: str) -> None:
    """``_post_process_rewards`` then ``compute_advantages_and_returns``: group mean (and std) for grpo / gspo / cispo,
    the group mean for reinforce_plus_plus_baseline, the reward itself for reinforce_plus_plus; whitened over the
    batch's tokens with ``--normalize-advantages`` (required by both REINFORCE++)."""
    normalize = not peer("disable-rewards-normalization")
    if estimator in ("grpo", "gspo", "cispo"):
        obj.set("adv_baseline", "group_mean" if normalize else "none", peer.show("disable-rewards-normalization"))
        obj.set("adv_std_normalize", normalize and not peer("disable-grpo-std-normalization")
                and peer.number("n-samples-per-prompt", int) > 1, peer.show("disable-grpo-std-normalization"))
    elif estimator == "reinforce_plus_plus_baseline":
        obj.set("adv_baseline", "group_mean" if normalize else "none", peer.show("advantage-estimator"))
        obj.set("adv_std_normalize", False, peer.show("advantage-estimator") + " (no group std)")
    elif estimator == "reinforce_plus_plus":
        obj.set("adv_baseline", "none", peer.show("advantage-estimator"))
        obj.set("adv_std_normalize", False, peer.show("advantage-estimator"))
        _slime_token_returns(peer, obj)
    elif estimator == "ppo":  # get_advantages_and_returns_batch over the critic's values; the KL at each token's reward
        obj.set("adv_baseline", "critic", peer.show("advantage-estimator") + ": GAE over a learned critic (critic.*)")
        obj.set("adv_std_normalize", False, peer.show("advantage-estimator"))
        obj.set("adv_gamma", peer.number("gamma", float), peer.show("gamma"))
        obj.set("adv_lambda", peer.number("lambd", float), peer.show("lambd"))
        if peer("kl-coef"):
            _slime_reward_kl(peer, obj, None, "")
    else:
        obj.blockers.append(f"{peer.show('advantage-estimator')} (needs an estimator minirl does not know)")
        return
    obj.set("adv_whiten", bool(peer("normalize-advantages")), peer.show("normalize-advantages"))
    if peer("kl-coef") and estimator == "reinforce_plus_plus_baseline":
        _slime_reward_kl(peer, obj, "adv_token_kl", "each token's advantage less --kl-coef x that token's KL")
    elif peer("kl-coef") and estimator not in ("reinforce_plus_plus", "ppo"):
        obj.differs.append(f"{peer.show('kl-coef')}: slime ignores the reward's KL for {estimator}; so does minirl")


def _slime_corrections(peer: SlimePeer, obj: Objective) -> None:
    """TIS (``--use-tis``: clamp(pi_old/mu_old, tis_clip_low, tis_clip) on each token's loss), slime's IcePop mask,
    ``--use-rollout-logprobs`` (pi_old := mu_old) and OPSM."""
    name = obj.values.get("algo.name", (None,))[0]
    custom = peer("custom-tis-function-path")
    tis = bool(peer("use-tis") or peer("get-mismatch-metrics"))
    if custom and not str(custom).endswith("icepop_function"):
        obj.blockers.append(peer.show("custom-tis-function-path"))
    if tis and name == "gspo":
        obj.blockers.append(peer.show("use-tis", "advantage-estimator") + " (a token weight on GSPO's sequence loss)")
    elif name != "gspo":
        obj.set("is_correction", tis, peer.show("use-tis"))
        if tis:
            obj.set("tis_mode", "mask" if custom else "truncate", peer.show("custom-tis-function-path"))
            obj.set("tis_cap", peer.number("tis-clip", float), peer.show("tis-clip"))
            obj.set("tis_floor", peer.number("tis-clip-low", float), peer.show("tis-clip-low"))
            obj.set("tis_level", "token", peer.show("use-tis"))
        if tis and not peer("use-tis"):
            obj.differs.append(f"{peer.show('get-mismatch-metrics')}: slime's code multiplies the loss by the TIS weight "
                               "under this flag too, as translated (minirl logs mismatch/* always)")
    if peer("use-rollout-logprobs"):
        obj.set("logp_old_source", "rollout", peer.show("use-rollout-logprobs") + " (pi_old := mu_old)")
    if peer("use-opsm") and name == "gspo":
        obj.blockers.append(peer.show("use-opsm", "advantage-estimator"))
    elif peer("use-opsm"):
        obj.set("opsm_threshold", peer.number("opsm-delta", float), peer.show("use-opsm", "opsm-delta"))
        if not peer("use-rollout-logprobs"):
            obj.differs.append(f"{peer.show('use-opsm')}: slime's statistic is the mean log(pi_old/pi_theta), minirl's "
                               "the mean log(mu_old/pi_theta) (the same under --use-rollout-logprobs)")


def _slime_token_returns(peer: SlimePeer, obj: Objective) -> None:
    """REINFORCE++'s discounted return per token (``get_reinforce_plus_plus_returns``): the reward at the last token less
    ``--kl-coef`` x the ``--kl-loss-type`` estimate of pi_old against the reference at each token, discounted by
    ``--gamma``: minirl's ``adv_token_returns`` with the KL in the reward. gamma = 1 without it: one per response."""
    gamma, coef = peer.number("gamma", float), peer.number("kl-coef", float)
    if gamma == 1.0 and not coef:
        return
    if coef:
        _slime_reward_kl(peer, obj, "adv_token_returns", "each token's return, the KL of that token and those after it")
    else:
        obj.set("adv_token_returns", True, peer.show("advantage-estimator", "gamma") + ": each token's return")
    obj.set("adv_gamma", gamma, peer.show("gamma"))


def _slime_reward_kl(peer: SlimePeer, obj: Objective, where: str | None, why: str) -> None:
    """``--kl-coef`` x the ``--kl-loss-type`` estimate of pi_old against the reference at each token, in each token's
    return (REINFORCE++, ``where`` = adv_token_returns), advantage (REINFORCE++-baseline, adv_token_kl) or GAE reward
    (PPO, None)."""
    kind = SLIME_KL_KINDS.get(str(peer("kl-loss-type")))
    if kind is None:
        obj.blockers.append(peer.show("kl-coef", "kl-loss-type"))
        return
    if where is not None:
        obj.set(where, True, peer.show("advantage-estimator", "kl-coef") + ": " + why)
    obj.set("kl_in_reward_coef", peer.number("kl-coef", float), peer.show("kl-coef"))
    obj.set("kl_in_reward_type", kind, peer.show("kl-loss-type") + " (slime's compute_approx_kl for the reward too)")


def _slime_critic(peer: SlimePeer, out: Translation) -> None:
    """slime's critic (``--advantage-estimator ppo``) as minirl's ``critic`` section: Megatron's optimizer settings,
    ``--critic-lr`` (``--lr`` when unset), ``--value-clip``, and ``--num-critic-only-steps`` N (rollouts 0..N-1 train
    the critic alone: the policy from global step N + 1)."""
    lr_key = "critic-lr" if peer("critic-lr") is not None else "lr"
    out.set("critic.lr", peer.number(lr_key, float), peer.show(lr_key))
    out.set("critic.weight_decay", peer.number("weight-decay", float), peer.show("weight-decay"))
    out.set("critic.grad_clip_norm", peer.number("clip-grad", float), peer.show("clip-grad"))
    out.set("critic.clip_value_range", peer.number("value-clip", float), peer.show("value-clip"))
    only = peer.number("num-critic-only-steps", int)
    out.set("critic.warmup_steps", only + 1 if only else 0, peer.show("num-critic-only-steps") +
            " (the policy trains from rollout N on, minirl's global step N + 1)")
    if peer("critic-load"):
        out.not_translated.append(f"{peer.show('critic-load')}: a Megatron checkpoint of the critic; minirl's critic "
                                  "starts from --hf-checkpoint under a new value head (critic.model_path: an HF directory)")
    if peer.number("critic-lr-warmup-iters", int):
        out.set("critic.lr_warmup_updates", peer.number("critic-lr-warmup-iters", int), peer.show("critic-lr-warmup-iters"))
    out.set("critic.loss_aggregation", "token_mean" if peer("calculate-per-token-loss") else "seq_mean",
            peer.show("calculate-per-token-loss") + " (the value loss's too: each sample's token mean, averaged, when unset)")
    placed = [key for key in ("critic-save", "critic-num-nodes", "critic-num-gpus-per-node") if peer(key) is not None]
    if placed:
        out.ignored.append(f"{peer.show(*placed)} (minirl's critic lives in the run's process; its weights and optimizer "
                           "are in every checkpoint)")


def _slime_penalties(peer: SlimePeer, obj: Objective) -> None:
    """The KL loss to the reference (``--use-kl-loss``) and the entropy bonus."""
    if peer("use-kl-loss") and peer("kl-loss-coef"):
        kind = SLIME_KL_KINDS.get(str(peer("kl-loss-type")))
        if kind is None:
            obj.blockers.append(peer.show("kl-loss-type"))
        else:
            obj.set("kl_coef", peer.number("kl-loss-coef", float), peer.show("use-kl-loss", "kl-loss-coef"))
            obj.set("kl_loss_type", kind, peer.show("kl-loss-type"))
            if peer("use-unbiased-kl"):  # each token's estimate x pi_theta/pi_old, the gradient through both
                obj.set("kl_loss_unbiased", True, peer.show("use-unbiased-kl"))
                if kind == "k3":
                    obj.differs.append("--use-unbiased-kl with k3: minirl clamps k3 to [-10, 10] before the ratio "
                                       "weighs it, slime's low_var_kl after")
            if peer("kl-loss-type") == "k3":  # minirl's k3 is low_var_kl's
                obj.differs.append("--kl-loss-type k3: minirl clamps each token's k3 to [-10, 10] (slime's low_var_kl), "
                                   "slime's k3 is not clamped (the same below 10)")
    if peer("entropy-coef"):
        obj.set("entropy_coef", peer.number("entropy-coef", float), peer.show("entropy-coef"))
        if not peer("calculate-per-token-loss"):
            obj.differs.append(f"{peer.show('entropy-coef')}: slime averages the entropy per sample first, minirl over "
                               "the tokens")


# ------------------------------------------------------------------ reading slime's settings


def read_slime(paths: list[str], words: list[str]) -> dict[str, Any]:
    """slime flags from launch scripts (``.sh``: the ``train.py`` command's), ``--custom-config-path`` YAML files
    (keys with ``_`` or ``-``) and the words of a command line (``--flag value ...``)."""
    given: dict[str, Any] = {}
    for path in paths:
        if path.endswith((".yaml", ".yml")):
            given.update({str(key).replace("_", "-"): value for key, value in read_yaml(path).items()})
        else:
            given.update(script_flags(Path(path)))
    given.update(parse_flags(words))
    custom = given.get("custom-config-path")
    if custom:  # slime sets each of its keys on args after parsing the flags (slime_validate_args): they win
        if not Path(str(custom)).is_file():
            raise ConfigError(f"--custom-config-path {custom}: no such file (slime reads it at start; run the "
                              "translation where the script runs, or give its path)")
        values = read_yaml(str(custom))
        given.update({str(key).replace("_", "-"): value for key, value in values.items()})
        given["$custom_config"] = {str(key): value for key, value in values.items()}
    return given


def parse_flags(words: list[Any], text: frozenset[str] = SLIME_TEXT) -> dict[str, Any]:
    """``--flag`` words and their values: none = True (a store_true flag), one, or a list (nargs); ``--flag=value``
    too. Words before the first flag are left out. The values of the peer's text flags (``text``: slime's
    ``SLIME_TEXT``) stay as written; the others are read as numbers where they are."""
    given: dict[str, Any] = {}
    key: str | None = None
    values: list[Any] = []

    def read(word: Any) -> Any:
        return word if isinstance(word, Unresolved) or key in text else parse_value(word)

    def flush() -> None:
        if key is not None:
            given[key] = True if not values else values[0] if len(values) == 1 else values

    for word in words:
        if isinstance(word, str) and word.startswith("--") and len(word) > 2:
            flush()
            key, equals, value = word[2:].partition("=")
            values = [read(value)] if equals else []
        elif key is not None:
            values.append(read(word))
    flush()
    return given


TRAIN_SCRIPT = re.compile(r"(^|/)train(_async)?\.py$")


@dataclasses.dataclass
class _Scope:
    """What a script has set so far: its variables (the environment's first; ``COMMAND`` for one set from a command's
    output), its arrays (each word with the conditionally set names it came from), the conditionally set names behind
    each variable, where each of those was last set (line, how) and the command behind each variable set from one."""

    variables: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    arrays: dict[str, list[tuple[Any, set[str]]]] = dataclasses.field(default_factory=dict)
    depends: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    where: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    commanded: dict[str, str] = dataclasses.field(default_factory=dict)

    def elements(self) -> dict[str, list[str | None]]:
        """Each array's elements as ``fields`` reads them (``COMMAND`` for a command's output, None unresolved)."""
        return {name: [value if isinstance(value, str) else COMMAND if isinstance(value, CommandOutput) else None
                       for value, _ in items] for name, items in self.arrays.items()}


def script_flags(path: Path, launch: re.Pattern[str] = TRAIN_SCRIPT, text_flags: frozenset[str] = SLIME_TEXT,
                 missing: str = "no `python3 train.py --flag value ...` command found (slime's launch line)") -> dict[str, Any]:
    """The flags of a slime launch script's ``train.py`` / ``train_async.py`` command: its ``${ARRAY[@]}`` words
    from the script's bash arrays (``declare -a`` / ``local`` / ``readonly`` ones too), its ``$NAME`` from the script's
    variables (and the environment's), split at blanks where unquoted, and ``$((...))`` evaluated. A word naming a
    variable set nowhere, or a command's output (not run here), is kept ``Unresolved``; an array set nowhere (a sourced
    model file's) is listed under ``$sourced``; a flag taking a variable set inside an ``if`` / ``case`` / loop block,
    a function or after ``cond &&`` / ``cond ||`` (``shell.statements``), under ``$conditional``. ``launch``: the
    command's script or module word (OpenRLHF's ``openrlhf.cli.train_ppo_ray`` too), ``text_flags``: its text flags,
    ``missing``: the line when the script has none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror or err}") from None
    scope = _Scope()
    scope.variables.update(arguments((), str(path)))  # run as `bash run.sh`: $0 the script, no $1...
    flags: dict[str, Any] | None = None
    for line, words, how in statements(text):
        at = f"{path}:{line}"
        for word in words:  # ${X:=v}: bash assigns X as it expands the word
            for name, value in default_assignments(word, scope.variables):
                _assign(scope, f"{name}={value}", (line, how), at)
        array = ARRAY.fullmatch(words[0])
        if array and len(words) > 1 and words[1] == OPEN:
            items = words[2:words.index(CLOSE)] if CLOSE in words else words[2:]
            _assign_array(scope, array.group(1), items, bool(array.group(2)), (line, how), at)
        elif all(NAME_VALUE.fullmatch(word) for word in words):
            for word in words:
                _assign(scope, word, (line, how), at)
        elif any(launch.search(unquoted(word)) for word in words):
            flags = _train_flags(words, scope, path, at, launch, text_flags)
    if flags is None:
        raise ConfigError(f"{path}: {missing}")
    return flags


def _train_flags(words: list[str], scope: _Scope, path: Path, at: str, launch: re.Pattern[str] = TRAIN_SCRIPT,
                 text: frozenset[str] = SLIME_TEXT) -> dict[str, Any]:
    """The flags of the ``train.py`` command ``words`` (``$sourced``, ``$script`` and ``$conditional`` with them)."""
    start = next(i for i, word in enumerate(words) if launch.search(unquoted(word)))
    sourced: list[str] = []
    expanded_words: list[tuple[Any, set[str]]] = []
    for word in words[start + 1:]:
        values, missing = _word(word, scope, at)
        expanded_words += values
        sourced += missing
    return {**parse_flags([value for value, _ in expanded_words], text), **({"$sourced": sourced} if sourced else {}),
            "$script": Path(unquoted(words[start])).name, **_conditional(expanded_words, scope.where, path)}


def _assign(scope: _Scope, word: str, where: tuple[int, str], at: str) -> None:
    """``NAME=value``: the word's value as bash expands it, unsplit (``shell.assigned``); one taking a command's
    output (not run here) is ``COMMAND`` (the environment's value is gone); one naming a variable set nowhere leaves
    it as it was. On an array, bash sets its first element (``ARR=x`` is ``ARR[0]=x``)."""
    name, value = NAME_VALUE.fullmatch(word).groups()  # type: ignore[union-attr]
    expanded = assigned(value, scope.variables, scope.elements(), where=at)
    command = command_behind(value, scope.commanded, at) if expanded == COMMAND else None
    deps = depends_on(value, scope.depends) | ({name} if where[1] else set())
    if name in scope.arrays:
        text = why_unresolved(unquoted(value), value, scope.variables, scope.elements())
        item = (CommandOutput(unquoted(value), at, command) if command else Unresolved(text, at)
                if expanded in (None, COMMAND) or expanded.startswith(STOPPED) else expanded)
        scope.arrays[name][:1] = [(item, deps)]
        _first_element(scope, name, where)
        return
    if expanded is not None:
        scope.variables[name] = expanded
    _set(scope, name, command, deps, where)


def _assign_array(scope: _Scope, name: str, items: list[str], append: bool, where: tuple[int, str], at: str) -> None:
    """``NAME=( ... )`` / ``NAME+=( ... )``: its words as bash expands them. ``$NAME`` / ``${NAME}`` is the first
    (bash's ``${NAME[0]}``), ``${NAME[@]}`` all of them."""
    own = {name} if where[1] else set()
    expanded = [(value, deps | own) for word in items for value, deps in _word(word, scope, at)[0]]
    scope.arrays[name] = (scope.arrays.get(name, []) if append else []) + expanded
    _first_element(scope, name, where)


def _first_element(scope: _Scope, name: str, where: tuple[int, str]) -> None:
    """``$NAME`` of an array: its first element (``COMMAND`` for a command's output; unset where it is unresolved)."""
    first, deps = scope.arrays[name][0] if scope.arrays[name] else ("", set())
    command = first.command if isinstance(first, CommandOutput) else None
    if isinstance(first, str) or command:
        scope.variables[name] = first if isinstance(first, str) else COMMAND
    else:  # a word naming a variable set nowhere
        scope.variables.pop(name, None)
    _set(scope, name, command, deps, where)


def _set(scope: _Scope, name: str, command: str | None, deps: set[str], where: tuple[int, str]) -> None:
    """What an assignment to ``name`` leaves to read: the command behind it, its conditionally set names, and (when
    it may not run) where it is."""
    if command:
        scope.commanded[name] = command
    else:
        scope.commanded.pop(name, None)
    scope.depends[name] = deps
    if where[1]:
        scope.where[name] = where


def _word(word: str, scope: _Scope, where: str) -> tuple[list[tuple[Any, set[str]]], list[str]]:
    """A script word as the words it expands to (each with the conditionally set names it came from), and the arrays
    it names that the script never set. ``"${ARR[@]}"`` is each element a word, an unquoted ``${ARR[@]}`` /
    ``${ARR[*]}`` each split at its blanks; ``"${ARR[*]}"`` one word of them all (``fields``); ``${ARR[@]:1:2}``
    the elements in its span (``shell.bounds``)."""
    whole = re.fullmatch(f"({QUOTED}?)\\$\\{{([A-Za-z_]\\w*)\\[([@*])\\](?::(?![-=+?])([^}}]*))?\\}}{UNQUOTED}?", word)
    if whole and not (whole.group(1) and whole.group(3) == "*"):
        name = whole.group(2)
        if name not in scope.arrays:
            return [], [name]
        items = scope.arrays[name]
        span = (bounds(whole.group(4), len(items), scope.variables, scope.elements(), elements=True)
                if whole.group(4) is not None else (0, len(items)))
        if span is not None:
            return [(piece, deps) for value, deps in items[span[0]:span[1]]
                    for piece in (value.split() if isinstance(value, str) and not whole.group(1) else [value])], []
    expanded = fields(word, scope.variables, arrays=scope.elements())
    deps = depends_on(word, scope.depends)
    if expanded is not None:
        return [(value, deps) for value in expanded], []
    command = command_behind(word, scope.commanded, where)
    text = why_unresolved(unquoted(word), word, scope.variables, scope.elements())
    return [(CommandOutput(unquoted(word), where, command) if command else Unresolved(text, where), deps)], []


def _conditional(words: list[tuple[Any, set[str]]], where: dict[str, tuple[int, str]], path: Path) -> dict[str, Any]:
    """``$conditional``: a line for each variable set inside an ``if`` / ``case`` / loop block or a function, or after
    ``cond &&`` / ``cond ||``, that a flag takes."""
    flags: dict[str, list[str]] = {}
    flag = None
    for value, deps in words:
        if isinstance(value, str) and value.startswith("--") and len(value) > 2:
            flag = value.partition("=")[0]
        for name in sorted(deps):
            if flag and flag not in flags.setdefault(name, []):
                flags[name].append(flag)
    lines = [f"{path}:{where[name][0]}: {name} is set {where[name][1]}; the translation reads the script's last "
             f"assignment to it, whatever the condition ({', '.join(used)} take it): check them"
             for name, used in flags.items() if used]
    return {"$conditional": lines} if lines else {}
