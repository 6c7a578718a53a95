"""SFT examples from the user's data, in the shapes TRL's ``SFTTrainer`` takes.

* **prompt-completion**: ``{"prompt": ..., "completion": ...}``, both strings or both lists of
  chat messages. Strings: the prompt is tokenised by ``minirl.tasks.chat.encode_prompt``, exactly
  as the rollout engine tokenises it, then the completion's text plus EOS. Messages: the whole
  conversation is encoded (below) and what follows the prompt's rendering is trained (TRL's
  ``completion_only_loss``); the prompt's ids are then the engine's whenever no merge crosses the
  prompt's end (always with special-token turn markers, as ChatML's).
* **conversational**: ``{"messages": [...]}``: every assistant turn is a completion; what comes
  before it (system, user, earlier turns, the template's markup) is context. A chat is rendered and
  encoded whole, as TRL does, and the trained tokens found by character offsets (``_conversation``).
* **language modeling**: ``{"text": "..."}`` (TRL's ``dataset_text_field``): the text encoded with
  the tokenizer's special tokens, EOS appended unless it ends with it, every token but the first
  trained (there is no prompt to leave out).

A chat row's ``tools`` and ``chat_template_kwargs`` columns reach every rendering of it, as in TRL's ``SFTTrainer``
(``minirl.tasks.chat.row_template_args``): a function-calling set trains with its tool schemas in the prompt, its
assistant tool calls (``tool_calls``, content optional) trained and its tool results (role ``tool``) context.

Which tokens carry the loss (``cold_start.loss_on``, after TRL's ``completion_only_loss`` and
``assistant_only_loss``): ``completion`` (the default) = the completion / assistant tokens only;
``all`` = every token of the sequence but the first. ``cold_start.packing`` joins examples into
rows of at most ``cold_start.max_length`` tokens (whole examples; like TRL's "wrapped" packing, a
packed example attends to the examples before it in its row). Rows longer than ``max_length``
are cut at it. Bad rows are one-line ``TaskDataError`` naming the file and line, as for RL data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from minirl.tasks.chat import ChatTemplateError, encode_prompt, render_chat, row_template_args, template_kwargs
from minirl.tasks.jsonl import TaskDataError, check_messages, lookup_column
from minirl.types import Batch, Prompt

LossOn = Literal["completion", "all"]
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")  # as transformers' render_jinja_template


@dataclass
class SFTExample:
    """One training sequence: token ids and which of them carry the loss (``True`` = trained)."""

    input_ids: list[int]
    loss_mask: list[bool]


def read_sft_examples(path: str | Path | list[str], tokenizer: Any, *, loss_on: LossOn = "completion",
                      columns: tuple[str, str] = ("prompt", "completion"), chat_prompts: bool = False,
                      split: str = "train", config: str | None = None) -> list[SFTExample]:
    """Every row of ``path`` (any format ``minirl.tasks.data`` reads; ``split`` / ``config`` of a dataset directory;
    a list of them: their rows one after another) as an ``SFTExample``. ``columns``: where the prompt and the
    completion are (``cold_start.prompt_column`` / ``completion_column``, dotted names read nested fields);
    ``chat_prompts``: a string prompt becomes a user message (verl's SFT)."""
    from minirl.tasks.data import iter_rows

    if isinstance(path, list):
        return [example for one in path for example in read_sft_examples(
            one, tokenizer, loss_on=loss_on, columns=columns, chat_prompts=chat_prompts, split=split, config=config)]
    examples = []
    for where, row in iter_rows(Path(path), split=split, config=config):
        if isinstance(row, TaskDataError):
            raise row
        example = row_to_example(_renamed(row, where, columns), where, tokenizer, chat_prompts=chat_prompts)
        if loss_on == "all":
            example.loss_mask = [False] + [True] * (len(example.input_ids) - 1)
        examples.append(example)
    if not examples:
        raise TaskDataError(f"{path}: no rows")
    return examples


def _renamed(row: Any, where: str, columns: tuple[str, str]) -> Any:
    """The row in TRL's names: the configured prompt / completion columns as ``prompt`` / ``completion``."""
    if not isinstance(row, dict) or columns == ("prompt", "completion"):
        return row
    found = [lookup_column(row, key) for key in columns]
    if not all(ok for ok, _ in found):
        if "messages" in row or "text" in row:
            return row
        missing = [key for key, (ok, _) in zip(columns, found) if not ok]
        raise TaskDataError(f'{where}: no field "{missing[0]}" (cold_start.{"prompt" if missing[0] == columns[0] else "completion"}_column)')
    return {**{k: v for k, v in row.items() if k not in ("prompt", "completion")}, "prompt": found[0][1], "completion": found[1][1]}


def row_to_example(row: Any, where: str, tokenizer: Any, *, chat_prompts: bool = False) -> SFTExample:
    """One data row (prompt-completion, messages or text) as token ids with a completion-only mask.
    ``chat_prompts``: a string prompt is one user message through the chat template (``add_generation_prompt``,
    as the engine renders a chat prompt) and its string completion follows as text + EOS, verl's layout."""
    if not isinstance(row, dict) or not ("messages" in row or ("prompt" in row and "completion" in row) or "text" in row):
        raise TaskDataError(f'{where}: expected an object with "prompt" and "completion", with "messages" or with "text"')
    if "text" in row and not ("messages" in row or ("prompt" in row and "completion" in row)):
        return _text_example(row["text"], tokenizer, where)
    try:
        extra = row_template_args(row, where)
    except ValueError as exc:
        raise TaskDataError(str(exc)) from None
    if "messages" in row:
        messages = check_messages(_list(row["messages"], where, "messages"), where, "messages")
        if not any(m["role"] == "assistant" for m in messages):
            raise TaskDataError(f'{where}: field "messages" has no assistant message to learn')
        return _chat_example(messages, tokenizer, where, extra=extra)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, str) and isinstance(completion, str):
        if not prompt.strip() or not completion.strip():
            raise TaskDataError(f'{where}: field "{"prompt" if not prompt.strip() else "completion"}" is empty')
        user = [{"role": "user", "content": prompt}] if chat_prompts else None
        prompt_ids = encode_prompt(tokenizer, Prompt(text=prompt, answer="", messages=user, meta=extra), cut=False)
        completion_ids = list(tokenizer.encode(completion, add_special_tokens=False)) + [tokenizer.eos_token_id]
        return SFTExample(prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids))
    if isinstance(prompt, list) and isinstance(completion, list):
        prompt = check_messages(prompt, where, "prompt")
        completion = check_messages(completion, where, "completion")
        return _chat_example(prompt + completion, tokenizer, where, first_trained=len(prompt), extra=extra)
    raise TaskDataError(f'{where}: fields "prompt" and "completion" must both be strings or both lists of chat messages')


def _text_example(text: Any, tokenizer: Any, where: str) -> SFTExample:
    """TRL's language-modeling row: the whole text is trained (but its first token), EOS appended."""
    if not isinstance(text, str) or not text.strip():
        raise TaskDataError(f'{where}: field "text" must be a non-empty string')
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if not ids or ids[-1] != tokenizer.eos_token_id:
        ids.append(tokenizer.eos_token_id)
    return SFTExample(ids, [False] + [True] * (len(ids) - 1))


def _list(value: Any, where: str, key: str) -> list:
    if not isinstance(value, list):
        raise TaskDataError(f'{where}: field "{key}" must be a list of chat messages')
    return value


def _chat_example(messages: list[dict], tokenizer: Any, where: str, first_trained: int = 0,
                  extra: dict[str, Any] | None = None) -> SFTExample:
    try:
        return _conversation(messages, tokenizer, first_trained, extra)
    except ChatTemplateError as exc:  # one line naming the row
        raise TaskDataError(f"{where}: {exc}") from None


def _conversation(messages: list[dict], tokenizer: Any, first_trained: int = 0, extra: dict[str, Any] | None = None
                  ) -> SFTExample:
    """Token ids of a chat, encoded whole; assistant turns from ``first_trained`` on carry the loss.

    As TRL: the conversation is rendered once by the chat template and the text encoded once
    (``input_ids`` are exactly ``apply_chat_template(messages, tokenize=True)``, whatever merges the
    tokenizer makes across turns). Which tokens are trained, in characters of that text:

    * a template with ``{% generation %}`` blocks says it itself: transformers'
      ``return_assistant_tokens_mask`` (TRL's ``assistant_only_loss``);
    * any other template: each assistant turn is what the template writes for it after the
      generation prompt, ``render(messages[:i+1])[len(render(messages[:i], add_generation_prompt=True)):]``
      (its content and end of turn, e.g. ``7<|im_end|>\n``), located in the whole text
      (``_assistant_spans``).

    A token is trained when it overlaps a trained span (transformers' rule for the assistant mask),
    so a token that a merge spreads across a turn boundary is trained. For prompt-completion rows
    (``first_trained`` > 0) only tokens after the prompt's rendering (with generation prompt) count,
    as TRL's ``completion_only_loss``.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ChatTemplateError("SFT on chat rows needs a fast tokenizer (character offsets); this tokenizer is not one")
    text = render_chat(tokenizer, messages, add_generation_prompt=False, extra=extra)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoding["input_ids"]), [tuple(o) for o in encoding["offset_mapping"]]
    start = 0
    if first_trained:
        prompt = render_chat(tokenizer, messages[:first_trained], add_generation_prompt=True, extra=extra)
        if not text.startswith(prompt):
            raise ChatTemplateError("the chat template does not render the prompt as a prefix of prompt + completion")
        start = len(prompt)
    if GENERATION_BLOCK.search(str(tokenizer.chat_template)):
        marked = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                               **template_kwargs(tokenizer, extra))
        if list(marked["input_ids"]) != ids:
            raise ChatTemplateError("apply_chat_template's token ids differ from the encoding of its rendered text")
        mask = [bool(m) and end > start for m, (_, end) in zip(marked["assistant_masks"], offsets)]
    else:
        spans = [(max(lo, start), hi) for lo, hi in _assistant_spans(tokenizer, messages, text, extra) if hi > start]
        mask = [any(lo < b and hi > a for a, b in spans) for lo, hi in offsets]
    return SFTExample(ids, mask)


def _assistant_spans(tokenizer: Any, messages: list[dict], text: str, extra: dict[str, Any] | None = None
                     ) -> list[tuple[int, int]]:
    """``[start, end)`` in ``text`` of each assistant turn (the template's text for it after the generation prompt).

    Both renderings must be prefixes of the whole text (a template that rewrites earlier turns, e.g.
    drops their reasoning, cannot be split this way: it needs ``{% generation %}`` blocks).
    """
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        context = render_chat(tokenizer, messages[:index], add_generation_prompt=True, extra=extra)
        turn = render_chat(tokenizer, messages[: index + 1], add_generation_prompt=False, extra=extra)
        if not (turn.startswith(context) and text.startswith(turn)):
            raise ChatTemplateError(
                "the chat template does not render a conversation as a prefix of its continuation; give it "
                "{% generation %} blocks around assistant turns (TRL's training templates) to mark them"
            )
        spans.append((len(context), len(turn)))
    return spans


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
