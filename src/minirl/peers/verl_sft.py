"""verl's SFT run as minirl's cold start: ``minirl config from-verl run_ppo.sh --sft run_sft.sh``.

Two verl SFT trainers, told apart by the module the script runs:

* ``verl.trainer.fsdp_sft_trainer`` (``sft_trainer.yaml``): its dataset reads a prompt and a response column
  (``data.prompt_key`` / ``data.response_key``, walked into by ``data.prompt_dict_keys`` / ``data.response_dict_keys``:
  ``extra_info`` then ``question`` is the column ``extra_info.question``), renders the prompt as one user message
  through the chat template with the generation prompt, and trains the response + EOS after it:
  ``cold_start.chat_prompts`` (verl's layout) with the dotted columns. With ``data.multiturn.enable`` the rows are
  chats (``{"messages": [...]}``), every assistant turn trained.
* ``verl.trainer.sft_trainer`` (``sft_trainer_engine.yaml``, the optimizer of ``optim/fsdp.yaml``): every row a chat
  (``data.messages_key``) with its tools (``data.tools_key``) and thinking switch (``data.enable_thinking_key``),
  the assistant turns trained, as minirl trains a ``{"messages", "tools", "enable_thinking"}`` row;
  ``data.apply_chat_template_kwargs`` are the template's variables.

Both: ``data.train_batch_size`` rows per optimizer step, whole batches only (``drop_last``), so ``total_epochs`` x
(rows // batch) steps unless ``trainer.total_training_steps``; the warm-up a share of them (``int()``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from minirl.config import ConfigError
from minirl.peers.common import Peer, Translation, count_rows, leftovers, note_local_path

FSDP_SFT_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 256, "data.train_files": "~/data/gsm8k/train.parquet", "data.prompt_key": "question",
    "data.response_key": "answer", "data.prompt_dict_keys": ["question"], "data.response_dict_keys": ["answer"],
    "data.multiturn.enable": False, "data.multiturn.messages_key": "messages", "data.max_length": 1024,
    "data.truncation": "error", "data.chat_template": None, "model.partial_pretrain": "~/models/gemma-1.1-7b-it",
    "model.lora_rank": 0, "optim.lr": 1e-5, "optim.betas": [0.9, 0.95], "optim.weight_decay": 0.01,
    "optim.warmup_steps_ratio": 0.1, "optim.clip_grad": 1.0, "optim.lr_scheduler": "cosine", "use_remove_padding": False,
    "trainer.total_epochs": 4, "trainer.total_training_steps": None, "trainer.seed": 1,
}
"""verl's ``sft_trainer.yaml`` (``fsdp_sft_trainer``), the keys the translation reads."""

ENGINE_SFT_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 256, "data.train_files": "~/data/gsm8k/train.parquet", "data.messages_key": "messages",
    "data.tools_key": "tools", "data.enable_thinking_key": "enable_thinking", "data.max_length": 1024,
    "data.truncation": "error", "data.apply_chat_template_kwargs": {}, "model.path": "~/models/deepseek-llm-7b-chat",
    "model.lora_rank": 0, "model.use_remove_padding": False, "optim.lr": 1e-3, "optim.lr_warmup_steps_ratio": 0.0,
    "optim.lr_warmup_steps": -1, "optim.betas": [0.9, 0.999], "optim.weight_decay": 0.01, "optim.clip_grad": 1.0,
    "optim.warmup_style": "constant", "optim.lr_scheduler_type": None, "trainer.total_epochs": 4,
    "trainer.total_training_steps": None, "trainer.seed": 1,
}
"""verl's ``sft_trainer_engine.yaml`` with ``optim/fsdp.yaml`` and ``model/hf_model.yaml`` (``sft_trainer``)."""

VERL_SFT_IGNORED = re.compile(
    r"^(data\.(micro_batch_size(_per_gpu)?|val_files|balance_dp_token|use_shm|custom_cls\..*|image_key|processor\..*|"
    r"max_token_len_per_gpu|use_dynamic_bsz|pad_mode|train_max_samples|val_max_samples|ignore_input_ids_mismatch)|"
    r"model\.(fsdp_config\..*|external_lib|trust_remote_code|use_liger|use_shm|strategy|enable_gradient_checkpointing|"
    r"lora_alpha|target_modules)|ulysses_sequence_parallel_size|engine\..*|checkpoint\..*|profiler\..*|"
    r"optim\.(optimizer|optimizer_impl|total_training_steps|min_lr_ratio|num_cycles|override_optimizer_config)|"
    r"trainer\.(default_local_dir|default_hdfs_dir|resume_path|resume_mode|resume_from_path|project_name|"
    r"experiment_name|logger|save_freq|test_freq|nnodes|n_gpus_per_node|max_ckpt_to_keep|device|profile_interval|"
    r"checkpoint\..*))$")
"""Settings of verl's SFT runs with no effect on what the cold start learns (memory, parallelism, logging, files)."""


ENGINE_ONLY = ("engine.", "data.messages_key", "data.tools_key", "data.enable_thinking_key", "model.path",
               "optim.lr_warmup_steps")
"""Keys only the engine-based ``sft_trainer`` has: a config without a module is that trainer's when it sets one."""


def add_verl_sft(out: Translation, given: dict[str, Any]) -> None:
    """The cold start of ``out`` from a verl SFT run's settings (``read_verl`` of its script or YAML)."""
    given = {key.lstrip("+~"): value for key, value in given.items()}
    out.differs += given.pop("$conditional", [])
    engine_keys = any(key.startswith(ENGINE_ONLY) for key in given)  # a YAML names no module: its keys tell
    module = str(given.pop("-m", "verl.trainer.sft_trainer" if engine_keys else "verl.trainer.fsdp_sft_trainer"))
    if "sft" not in module:
        raise ConfigError(f"--sft: the script runs {module}, not one of verl's SFT trainers (verl.trainer.sft_trainer, "
                          "verl.trainer.fsdp_sft_trainer)")
    engine = module.endswith(".sft_trainer")
    peer = Peer(given, ENGINE_SFT_DEFAULTS if engine else FSDP_SFT_DEFAULTS)
    out.set("cold_start.enabled", True, f"a verl SFT run given (--sft, {module})")
    _train_files(peer, out)
    if engine:
        _chats(peer, out)
    else:
        _columns(peer, out)
    batch = int(peer("data.train_batch_size"))
    out.set("cold_start.batch_sequences", batch, f"SFT {peer.show('data.train_batch_size')}")
    out.set("cold_start.lr", float(peer("optim.lr")), f"SFT {peer.show('optim.lr')}")
    out.set("cold_start.max_length", int(peer("data.max_length")), f"SFT {peer.show('data.max_length')}")
    if peer("data.truncation") != "right":
        out.differs.append(f"SFT {peer.show('data.truncation')}: minirl cuts a row longer than cold_start.max_length "
                           "at its end (verl's 'right'); verl's 'error' stops at it, 'left' cuts its start")
    _steps(peer, out, batch, engine)
    save = peer("trainer.save_freq")
    if isinstance(save, int) and not isinstance(save, bool) and save > 0:  # its checkpoints: the state a stop continues from
        out.set("cold_start.checkpoint_every_steps", save, f"SFT {peer.show('trainer.save_freq')}")
    model_key = "model.path" if engine else "model.partial_pretrain"
    rl_model = out.values.get("model.path")
    if rl_model and peer(model_key) != rl_model:
        out.differs.append(f"SFT {peer.show(model_key)}: minirl's cold start fine-tunes model.path ({rl_model!r}) and "
                           "RL starts from the result")
    padding = "model.use_remove_padding" if engine else "use_remove_padding"
    if peer(padding):  # the same forward without padding; minirl's switch covers RL's forwards too
        out.set("optim.padding_free", True, f"SFT {peer.show(padding)}")
    out.differs.append(f"SFT {peer.show('optim.betas', 'optim.weight_decay', 'optim.clip_grad')}: minirl's SFT "
                       "runs AdamW with the RL run's betas and gradient clip, and no weight decay")
    if int(peer("model.lora_rank")) > 0:
        out.not_translated.append(f"SFT {peer.show('model.lora_rank')}: minirl's LoRA (model.lora.*) is the whole run's, "
                                  "SFT and RL alike")
    peer("trainer.seed")  # the RL run's seed; cold_start.seed defaults to it
    leftovers(peer, out, VERL_SFT_IGNORED, prefix="SFT ")


def _train_files(peer: Peer, out: Translation) -> None:
    files = peer("data.train_files")
    files = files if isinstance(files, list) else [files]
    out.set("cold_start.data", str(files[0]) if len(files) == 1 else [str(f) for f in files],
            f"SFT {peer.show('data.train_files')}")
    for file in files:
        note_local_path(out, "SFT data.train_files", str(file), "data", "cold_start.data")


def _columns(peer: Peer, out: Translation) -> None:
    """``fsdp_sft_trainer``: where a row's prompt and response are (module docstring), or its chats."""
    if peer("data.multiturn.enable"):
        if peer("data.multiturn.messages_key") != "messages":
            out.not_translated.append(f"SFT {peer.show('data.multiturn.messages_key')}: minirl reads a chat row's "
                                      "\"messages\" column")
        return
    for side, key, keys in (("prompt", "data.prompt_key", "data.prompt_dict_keys"),
                            ("completion", "data.response_key", "data.response_dict_keys")):
        column = peer(key)
        column = column[0] if isinstance(column, list) else column  # verl takes a list's first
        dotted = ".".join([str(column), *(str(part) for part in peer(keys) or [])])
        out.set(f"cold_start.{side}_column", dotted, f"SFT {peer.show(key, keys)}")
    out.set("cold_start.chat_prompts", True, "verl's SFT renders the prompt as a user message through the chat template")
    if peer("data.chat_template"):
        out.not_translated.append(f"SFT {peer.show('data.chat_template')}: give the template file as task.chat_template")
    if peer("optim.lr_scheduler") != "constant":
        out.differs.append(f"SFT {peer.show('optim.lr_scheduler')}: minirl's SFT keeps its rate constant after warm-up")


def _chats(peer: Peer, out: Translation) -> None:
    """``sft_trainer``: chat rows, their tools and template variables."""
    for key, ours in (("data.messages_key", "messages"), ("data.tools_key", "tools")):
        if peer(key) != ours:
            out.not_translated.append(f"SFT {peer.show(key)}: minirl reads a chat row's \"{ours}\" column")
    if peer("data.enable_thinking_key") != "enable_thinking":  # minirl reads a row's "enable_thinking" column
        out.not_translated.append(f"SFT {peer.show('data.enable_thinking_key')}: minirl reads a row's thinking switch "
                                  "from its \"enable_thinking\" column")
    kwargs = peer.mapping("data.apply_chat_template_kwargs")
    if kwargs:
        rl = out.values.get("task.chat_template_kwargs")
        if rl is None or rl == dict(kwargs):
            out.set("task.chat_template_kwargs", dict(kwargs), f"SFT {peer.show('data.apply_chat_template_kwargs')}")
        else:
            out.differs.append(f"SFT {peer.show('data.apply_chat_template_kwargs')}: minirl renders SFT and RL with one "
                               f"task.chat_template_kwargs, the RL run's {rl!r}")
    style = peer("optim.lr_scheduler_type") or peer("optim.warmup_style")
    if style != "constant":
        out.differs.append(f"SFT {peer.show('optim.lr_scheduler_type', 'optim.warmup_style')}: minirl's SFT keeps its "
                           "rate constant after warm-up")


def _steps(peer: Peer, out: Translation, batch: int, engine: bool) -> None:
    """``trainer.total_training_steps``, else ``total_epochs`` x whole batches of the rows; the warm-up."""
    steps = peer("trainer.total_training_steps")
    if steps:
        out.set("cold_start.steps", int(steps), f"SFT {peer.show('trainer.total_training_steps')}")
    elif rows := count_rows(out.values.get("cold_start.data")):
        epochs = peer("trainer.total_epochs")
        steps = max(1, (rows // batch) * int(epochs))  # verl's loader drops the last partial batch
        out.set("cold_start.steps", steps, f"SFT trainer.total_epochs={epochs} x {rows} rows // {batch}")
    else:
        out.not_translated.append(f"SFT {peer.show('trainer.total_epochs')} without total_training_steps and with "
                                  "the data not here: set cold_start.steps")
        return
    if engine and int(peer("optim.lr_warmup_steps")) > 0:
        out.set("cold_start.warmup_steps", int(peer("optim.lr_warmup_steps")), f"SFT {peer.show('optim.lr_warmup_steps')}")
        return
    key = "optim.lr_warmup_steps_ratio" if engine else "optim.warmup_steps_ratio"
    out.set("cold_start.warmup_steps", math.floor(float(peer(key)) * steps), f"SFT {peer.show(key)} x steps")
