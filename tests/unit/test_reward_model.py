"""A reward model as a reward function (TRL's ``reward_funcs="path"``): what it reads, its score, where it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification

from minirl.config import ConfigError, load_config
from minirl.models.tokenizer import build_char_tokenizer
from minirl.tasks import build_task
from minirl.tasks.reward_model import RewardModel
from minirl.tasks.reward_runner import RewardRunner
from minirl.tasks.rewards import RewardSpecError
from minirl.types import Prompt

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
BAD = "tests.robustness.bad_rewards"


def _config(tokenizer, **changes) -> Qwen3Config:
    fields = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, intermediate_size=64, pad_token_id=tokenizer.pad_token_id)
    return Qwen3Config(**(fields | changes))


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sequence-classification reward model with its own chat template, saved as TRL's RewardTrainer would."""
    path = tmp_path_factory.mktemp("rm") / "tiny-rm"
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    torch.manual_seed(0)
    Qwen3ForSequenceClassification(_config(tokenizer, num_labels=1)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _by_hand(path: Path, text: str) -> float:
    """The score of one text, alone: the model's output at its last token (no padding)."""
    model = Qwen3ForSequenceClassification.from_pretrained(path).eval()
    ids = build_char_tokenizer()(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, 0].item()


def test_it_reads_what_trl_feeds_a_reward_model_and_scores_its_first_logit(reward_dir: Path) -> None:
    rm = RewardModel(reward_dir, batch_size=2)
    assert rm.__name__ == "tiny-rm"  # TRL names a reward model by its path's last part
    # text prompts: prompt + completion; three rows in batches of 2, padded on the right
    prompts, completions = ["ab", "abcdef", "q"], ["x", "yy", "zzzzzzz"]
    assert rm.texts(prompts, completions) == ["abx", "abcdefyy", "qzzzzzzz"]
    scores = rm(prompts, completions)
    assert scores == pytest.approx([_by_hand(reward_dir, t) for t in ("abx", "abcdefyy", "qzzzzzzz")], abs=1e-5)
    # chat prompts: prompt + completion messages through the reward model's own template
    chat = [[{"role": "user", "content": "ab"}]]
    reply = [[{"role": "assistant", "content": "x"}]]
    assert rm.texts(chat, reply) == ["<user>ab\n<assistant>x\n"]
    assert rm(chat, reply) == pytest.approx([_by_hand(reward_dir, "<user>ab\n<assistant>x\n")], abs=1e-5)
    assert len({round(s, 6) for s in scores}) == 3  # the head is not constant: the test can tell texts apart


def test_a_directory_that_is_no_reward_model_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RewardSpecError, match=r"not a model directory \(no config.json\)$"):
        RewardModel(tmp_path / "missing")
    with pytest.raises(RewardSpecError, match=r"does not download: `hf download OpenAssistant/rm --local-dir DIR`"):
        RewardModel("OpenAssistant/rm")
    tokenizer = build_char_tokenizer()
    Qwen3ForSequenceClassification(_config(tokenizer, num_labels=2)).save_pretrained(tmp_path / "two")
    with pytest.raises(RewardSpecError, match=r"2 outputs; a reward model has one"):
        RewardModel(tmp_path / "two")
    Qwen3ForCausalLM(_config(tokenizer)).save_pretrained(tmp_path / "lm")
    with pytest.raises(RewardSpecError, match=r"a Qwen3ForCausalLM, not a sequence classifier"):
        RewardModel(tmp_path / "lm")


def test_it_runs_in_the_trainer_beside_functions_in_workers_and_weighs_in(reward_dir: Path) -> None:
    task = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=[
        {"function": f"{BAD}:worker_pid", "weight": 0.0}, {"model": str(reward_dir), "weight": 2.0}])
    prompts = [Prompt(text="ab", answer="ba"), Prompt(text="cd", answer="dc")]
    with RewardRunner(task, timeout_s=5.0) as runner:
        assert runner.in_worker and runner._setup["functions"][1] is None  # the model is never sent to a worker
        rewards, stats = runner.score(prompts, [(0, "x"), (1, "yy")])
    expected = [_by_hand(reward_dir, "abx"), _by_hand(reward_dir, "cdyy")]
    assert rewards.tolist() == pytest.approx([2.0 * e for e in expected], abs=1e-5)
    assert stats["reward/tiny-rm/mean"] == pytest.approx(sum(expected) / 2, abs=1e-5)
    assert stats["reward/worker_pid/mean"] != float(os.getpid())  # the function did run in a worker
    # a reward model alone starts no worker at all
    alone = build_task("reverse", difficulty=2, num_train=2, num_eval=1, reward_functions=[{"model": str(reward_dir)}])
    with RewardRunner(alone, timeout_s=5.0) as runner:
        assert not runner.in_worker and runner._workers == []
        assert runner.score(prompts, [(0, "x")])[0].tolist() == pytest.approx(expected[:1], abs=1e-5)


def test_config_entries_name_a_function_or_a_model(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    for entry, message in [("{model: m, function: 'a:b'}", "names a 'function' or a reward 'model' (one of them)"),
                           ("{weight: 1.0}", "names a 'function' or a reward 'model' (one of them)"),
                           ("{model: m, kwargs: {k: 1}}", "a reward 'model' entry takes no 'kwargs'")]:
        path.write_text(f"task:\n  reward_functions:\n    - {entry}\n")
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_config(path)
    path.write_text("task:\n  reward_functions:\n    - {model: /models/rm, weight: 0.5}\n")
    assert load_config(path).task.reward_functions[0].model == "/models/rm"


def test_python_reward_funcs_take_a_reward_model_path_or_object(reward_dir: Path) -> None:
    from minirl.api import _configure

    model = Qwen3ForSequenceClassification.from_pretrained(reward_dir)
    entries = _configure(None, [], None, None, None, [str(reward_dir), model, "pkg.mod:fn"], [1.0, 0.5, 1.0]).task.reward_functions
    assert [(e.model, e.function, e.weight) for e in entries] == [
        (str(reward_dir), None, 1.0), (str(reward_dir), None, 0.5), (None, "pkg.mod:fn", 1.0)]
    assert json.loads((reward_dir / "config.json").read_text())["architectures"] == ["Qwen3ForSequenceClassification"]
