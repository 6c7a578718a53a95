"""A reward model as a reward function: TRL's ``reward_funcs="path/to/reward-model"``.

    task:
      reward_functions:
        - {function: "my_rewards:correct"}               # a verifiable reward
        - {model: /models/my-reward-model, weight: 0.5}  # a sequence-classification model's score

A reward model is a local Hugging Face directory of an ``AutoModelForSequenceClassification`` with one output
(``num_labels: 1``). It scores each sample the way TRL's ``GRPOTrainer`` does (1.16, ``_calculate_rewards``):

* a chat prompt: prompt messages + the completion message, rendered by the **reward model's** tokenizer's chat
  template (no generation prompt; with ``task.chat_template_kwargs``, as TRL passes its own); a text prompt: prompt +
  completion, concatenated;
* tokenized without special tokens beyond the template's, padded on the right; the reward is ``logits[:, 0]``.

The model loads on the first call (in the process that scores: the trainer's; never a reward worker, because it
needs the accelerator and has no Python code that could hang), on CUDA in bf16 when the run's device is one, else on
the CPU in fp32, and scores ``batch_size`` samples per forward. Its metric is ``reward/<directory name>/mean``, as TRL
names a reward model by its path's last part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minirl.tasks.rewards import RewardSpecError


class RewardModel:
    """A batched reward function backed by a sequence-classification model (module docstring)."""

    in_process = True
    """Scored in the trainer's process (``RewardRunner`` never sends it to a worker)."""

    def __init__(self, path: str | Path, *, device: str = "cpu", batch_size: int = 16, trust_remote_code: bool = False,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.path = Path(path).expanduser()
        self.device, self.batch_size, self.trust_remote_code = device, batch_size, trust_remote_code
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.__name__ = self.path.name or str(path)
        self.__qualname__ = self.__name__
        self._check()
        self._model: Any = None
        self._tokenizer: Any = None

    def _check(self) -> None:
        """A missing directory or a model with more than one output is one line, before the run starts."""
        from minirl.hub import download_command, is_hub_id

        config_file = self.path / "config.json"
        if not config_file.is_file():
            hint = f"; minirl does not download: {download_command(self.path)}" if is_hub_id(self.path) else ""
            raise RewardSpecError(f"reward model {str(self.path)!r}: not a model directory (no config.json){hint}")
        config = json.loads(config_file.read_text())
        architectures = config.get("architectures") or []
        if architectures and not any(name.endswith("ForSequenceClassification") for name in architectures):
            raise RewardSpecError(f"reward model {str(self.path)!r}: a {architectures[0]}, not a sequence classifier "
                                  "(its score head would be untrained); train one first, e.g. with TRL's RewardTrainer")
        labels = config.get("num_labels") or len(config.get("id2label") or {}) or 2
        if labels != 1:
            raise RewardSpecError(f"reward model {str(self.path)!r}: {labels} outputs; a reward model has one "
                                  "(AutoModelForSequenceClassification with num_labels=1)")

    def __getstate__(self) -> dict[str, Any]:  # sent without its weights; loaded again where it scores
        return {**self.__dict__, "_model": None, "_tokenizer": None}

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from minirl.models.io import check_model_directory

        check_model_directory(self.path, trust_remote_code=self.trust_remote_code)
        cuda = self.device.startswith("cuda") and torch.cuda.is_available()
        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, dtype=torch.bfloat16 if cuda else torch.float32, local_files_only=True,
            trust_remote_code=self.trust_remote_code,
        )
        tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True, trust_remote_code=self.trust_remote_code)
        if tokenizer.pad_token is None:  # as TRL: pad with EOS, and tell the model which id pads
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        self._model, self._tokenizer = model.to(self.device if cuda else "cpu").eval(), tokenizer

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """What the reward model reads: a chat through its own template, else prompt + completion."""
        if prompts and isinstance(prompts[0], list):
            return [self._tokenizer.apply_chat_template(prompt + completion, tokenize=False, **self.chat_template_kwargs)
                    for prompt, completion in zip(prompts, completions, strict=True)]
        return [prompt + completion for prompt, completion in zip(prompts, completions, strict=True)]

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        import torch

        if self._model is None:
            self._load()
        texts = self.texts(prompts, completions)
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            inputs = self._tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True,
                                     padding_side="right", add_special_tokens=False).to(self._model.device)
            with torch.no_grad():
                scores += self._model(**inputs).logits[:, 0].float().tolist()
        return scores
