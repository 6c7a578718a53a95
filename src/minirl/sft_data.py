"""SFT examples from the user's data, in the two shapes TRL's ``SFTTrainer`` takes.

* **prompt-completion**: ``{"prompt": ..., "completion": ...}``, both strings or both lists of
  chat messages (the completion then holds the assistant message). The prompt is tokenised by
  ``minirl.tasks.chat.encode_prompt``, exactly as the rollout engine tokenises it, and the
  completion follows: its text (plus EOS) for strings; for chats, the rest of the conversation
  rendered by the chat template (which ends the assistant turn itself).
* **conversational**: ``{"messages": [...]}``: every assistant turn is a completion; what comes
  before it (system, user, earlier turns, the template's markup) is context.

Which tokens carry the loss (``cold_start.loss_on``, after TRL's ``completion_only_loss`` and
``assistant_only_loss``): ``completion`` (the default) = the completion / assistant tokens only;
``all`` = every token of the sequence but the first. ``cold_start.packing`` joins examples into
rows of at most ``cold_start.max_length`` tokens (whole examples; like TRL's "wrapped" packing, a
packed example attends to the examples before it in its row). Rows longer than ``max_length``
are cut at it. Bad rows are one-line ``TaskDataError`` naming the file and line, as for RL data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from minirl.tasks.chat import encode_prompt, render_chat
from minirl.tasks.jsonl import TaskDataError, check_messages
from minirl.types import Batch, Prompt

LossOn = Literal["completion", "all"]


@dataclass
class SFTExample:
    """One training sequence: token ids and which of them carry the loss (``True`` = trained)."""

    input_ids: list[int]
    loss_mask: list[bool]


def read_sft_examples(path: str | Path, tokenizer: Any, *, loss_on: LossOn = "completion") -> list[SFTExample]:
    """Every row of ``path`` (any format ``minirl.tasks.data`` reads) as an ``SFTExample``."""
    from minirl.tasks.data import iter_rows

    examples = []
    for where, row in iter_rows(Path(path)):
        if isinstance(row, TaskDataError):
            raise row
        example = row_to_example(row, where, tokenizer)
        if loss_on == "all":
            example.loss_mask = [False] + [True] * (len(example.input_ids) - 1)
        examples.append(example)
    if not examples:
        raise TaskDataError(f"{path}: no rows")
    return examples


def row_to_example(row: Any, where: str, tokenizer: Any) -> SFTExample:
    """One data row (prompt-completion or messages) as token ids with a completion-only mask."""
    if not isinstance(row, dict) or not ("messages" in row or ("prompt" in row and "completion" in row)):
        raise TaskDataError(f'{where}: expected an object with "prompt" and "completion", or with "messages"')
    if "messages" in row:
        messages = check_messages(_list(row["messages"], where, "messages"), where, "messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise TaskDataError(f'{where}: field "messages" has no assistant message to learn')
        return _conversation(messages, tokenizer)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        if not prompt.strip() or not completion.strip():
            raise TaskDataError(f'{where}: field "{"prompt" if not prompt.strip() else "completion"}" is empty')
        prompt_ids = encode_prompt(tokenizer, Prompt(text=prompt, answer=""))
        completion_ids = list(tokenizer.encode(completion, add_special_tokens=False)) + [tokenizer.eos_token_id]
        return SFTExample(prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids))
    if isinstance(prompt, list) and isinstance(completion, list):
        prompt = check_messages(prompt, where, "prompt")
        completion = check_messages(completion, where, "completion")
        return _conversation(prompt + completion, tokenizer, first_trained=len(prompt))
    raise TaskDataError(f'{where}: fields "prompt" and "completion" must both be strings or both lists of chat messages')


def _list(value: Any, where: str, key: str) -> list:
    if not isinstance(value, list):
        raise TaskDataError(f'{where}: field "{key}" must be a list of chat messages')
    return value


def _conversation(messages: list[dict], tokenizer: Any, first_trained: int = 0) -> SFTExample:
    """Token ids of a chat; assistant turns from ``first_trained`` on carry the loss.

    The context before each trained turn is encoded as one piece by ``encode_prompt`` (so the
    prompt of a single-turn chat is tokenised exactly as the engine does), then each assistant
    turn (the template's text between the generation prompt and the next context) is appended.
    """
    ids: list[int] = []
    mask: list[bool] = []
    rendered = ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant" or index < first_trained:
            continue
        context = render_chat(tokenizer, messages[:index], add_generation_prompt=True)
        if not ids:
            ids = encode_prompt(tokenizer, Prompt(text="", answer="", messages=messages[:index]))
        elif context.startswith(rendered):
            ids += tokenizer.encode(context[len(rendered):], add_special_tokens=False)
        mask += [False] * (len(ids) - len(mask))
        full = render_chat(tokenizer, messages[: index + 1], add_generation_prompt=False)
        if not full.startswith(context):
            raise TaskDataError("the chat template does not render a conversation as a prefix of its continuation")
        turn = tokenizer.encode(full[len(context):], add_special_tokens=False)
        ids += turn
        mask += [True] * len(turn)
        rendered = full
    return SFTExample(ids, mask)


def pack(examples: list[SFTExample], max_length: int) -> list[SFTExample]:
    """Whole examples joined, in order, into rows of at most ``max_length`` tokens."""
    rows: list[SFTExample] = []
    for example in examples:
        if rows and len(rows[-1].input_ids) + len(example.input_ids) <= max_length:
            rows[-1] = SFTExample(rows[-1].input_ids + example.input_ids, rows[-1].loss_mask + example.loss_mask)
        else:
            rows.append(SFTExample(list(example.input_ids), list(example.loss_mask)))
    return rows


def sft_batch(examples: list[SFTExample], pad_token_id: int, max_length: int | None = None) -> Batch:
    """A trainer ``Batch`` whose ``mask`` marks the loss tokens (targets ``input_ids[:, t+1]``)."""
    cut = [(e.input_ids[:max_length], e.loss_mask[:max_length]) for e in examples]
    width = max(len(ids) for ids, _ in cut)
    input_ids = torch.full((len(cut), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(cut), width), dtype=torch.bool)
    loss = torch.zeros((len(cut), width), dtype=torch.bool)
    for row, (ids, mask) in enumerate(cut):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = True
        loss[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    size = len(cut)
    return Batch(
        input_ids=input_ids, attention_mask=attention, mask=loss[:, 1:], logp_rollout=torch.zeros(size, width - 1),
        advantages=torch.zeros(size), group_ids=torch.arange(size),
    )
