"""``task.prompt_truncation``: a prompt over ``task.max_prompt_tokens`` is cut from the left (TRL's
``max_prompt_length``), the right or the middle (verl's ``data.truncation``) instead of being a bad row; the
engine, the trainer and SFT's task prompts see the same cut ids, SFT data rows are never cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minirl.cli import main
from minirl.config import ConfigError, load_config
from minirl.runtime import build_model, build_task
from minirl.sft_data import row_to_example
from minirl.tasks.chat import cut_prompt, encode_prompt
from minirl.types import Prompt


def test_cut_by_hand():
    ids = list(range(10))
    assert cut_prompt(ids, 4, "left") == [6, 7, 8, 9]
    assert cut_prompt(ids, 4, "right") == [0, 1, 2, 3]
    assert cut_prompt(ids, 4, "middle") == [0, 1, 8, 9]
    assert cut_prompt(ids, 5, "middle") == [0, 1, 7, 8, 9]  # verl: first max // 2, the rest from the end
    assert cut_prompt(ids, 10, "left") == ids and cut_prompt(ids, 3, "none") == ids and cut_prompt(ids, None, "left") == ids
    with pytest.raises(ValueError, match="left, right or middle"):
        cut_prompt(ids, 3, "both")


def test_an_unknown_side_is_one_line():
    with pytest.raises(ConfigError, match=r"task\.prompt_truncation: must be 'none', 'left', 'right' or 'middle'"):
        load_config(None, ["task.prompt_truncation=top"])


def _jsonl(tmp_path: Path) -> list[str]:
    """Three training prompts (two over 10 characters, one token each) and one held-out prompt."""
    data, held_out = tmp_path / "d.jsonl", tmp_path / "e.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in ("abcdefghijklmnopqrstuvwxyz", "abc", "xyzxyzxyzxyz")))
    held_out.write_text(json.dumps({"prompt": "ab", "answer": "1"}) + "\n")
    return ["task.kind=jsonl", f"task.path={data}", f"task.eval_path={held_out}"]


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_the_runs_tokenizer_cuts_and_no_row_is_bad(tmp_path, side):
    common = ["model.preset=qwen3-moe-tiny", *_jsonl(tmp_path), "task.max_prompt_tokens=10", f"task.prompt_truncation={side}"]
    cfg = load_config(None, common)
    model, tokenizer = build_model(cfg)
    lines: list[str] = []
    task = build_task(cfg, model, tokenizer, log=lines.append)
    assert len(task.train_prompts()) == 3 and task.skipped_rows == 0
    assert lines == [f"task: 2 of 4 prompts are longer than 10 tokens; each is cut from the {side} (task.prompt_truncation)"]
    for prompt in task.train_prompts():
        whole = encode_prompt(tokenizer, prompt, cut=False)
        assert encode_prompt(tokenizer, prompt) == cut_prompt(whole, 10, side)
    long = Prompt(text="abcdefghijklmnopqrstuvwxyz", answer="1")
    assert tokenizer.decode(encode_prompt(tokenizer, long)) == {"left": "qrstuvwxyz", "right": "abcdefghij",
                                                               "middle": "abcdevwxyz"}[side]
    # without task.max_prompt_tokens, the model's context less rollout.max_new_tokens bounds the prompt (512 - 500)
    cfg = load_config(None, [o for o in common if "max_prompt_tokens" not in o] + ["rollout.max_new_tokens=500"])
    _, tokenizer_12 = build_model(cfg)
    assert len(encode_prompt(tokenizer_12, long)) == 12
    # SFT data rows are whole (cold_start.max_length bounds them)
    example = row_to_example({"prompt": long.text, "completion": "zz"}, "row 1", tokenizer)
    assert len(example.input_ids) == len(encode_prompt(tokenizer, long, cut=False)) + 3


def test_a_run_samples_from_the_cut_prompts(tmp_path, capsys):
    from tests.resume.test_exact_resume import TINY

    overrides = [o for o in TINY if not o.startswith(("task.", "checkpoint."))]
    dump = tmp_path / "dump"
    argv = ["train", "configs/demo.yaml", *overrides, "optim.global_steps=1", "log.console=true", *_jsonl(tmp_path),
            "task.reward=exact", "task.max_prompt_tokens=10",
            "task.prompt_truncation=left", "rollout.prompts_per_step=3", "eval.num_prompts=1", "eval.every_steps=0",
            f"run.output_dir={tmp_path}", "run.name=cut", "--dump-rollouts", str(dump)]
    assert main(argv) == 0
    assert "task: 2 of 4 prompts are longer than 10 tokens; each is cut from the left" in capsys.readouterr().out
    state = torch.load(dump / "step_000001.pt", weights_only=True)
    lengths = sorted({len(c["prompt_ids"]) for c in state["completions"]})
    assert lengths == [3, 10]  # "abc", and the two longer prompts' last 10 tokens
