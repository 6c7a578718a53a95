"""How a prompt becomes token ids, once for the engine, the trainer and SFT; and when to stop.

``encode_prompt(tokenizer, prompt)`` is the one function that tokenises a prompt: the rollout
engines call it, so the trainer scores exactly those ids (``Completion.prompt_ids``), and SFT
calls it for its prompts too.

* A **conversational** prompt (``Prompt.messages``, TRL's ``[{"role": "user", "content": ...}]``)
  is rendered with the tokenizer's chat template, ``apply_chat_template(messages,
  add_generation_prompt=True)``, and the rendered text is encoded **without** the tokenizer's
  special tokens: the template writes BOS itself when the model wants one (this is what
  ``apply_chat_template(..., tokenize=True)`` does, so there is never a double BOS). A prompt whose
  last message is the assistant's (a prefilled start of the answer) is continued, as TRL does:
  ``continue_final_message=True`` and no generation prompt.
* A **plain-text** prompt is encoded as the tokenizer says (``add_special_tokens=True``: a
  tokenizer that prepends BOS prepends it; minirl's character tokenizer adds nothing). If the
  text itself already starts with the BOS token, the added one is dropped (no double BOS).

``task.chat_template`` in the config: ``auto`` (chat rows use the tokenizer's template; a
tokenizer without one is a one-line error), ``plain`` (chat rows are flattened to their
contents, one message per line, and encoded as plain text) or a path to a Jinja template file,
which becomes the tokenizer's ``chat_template`` (and is saved with every checkpoint).
``task.chat_template_kwargs`` (``{enable_thinking: false}``) are extra template variables of every
rendering, held by the run's tokenizer object (``apply_chat_setting``), never saved with it.

A data row may carry its own, as TRL's ``SFTTrainer`` and ``GRPOTrainer`` read them: a ``tools`` column (the
function schemas the template writes into the prompt, ``apply_chat_template(tools=...)``; a JSON string of them is
read as its list) and a ``chat_template_kwargs`` column (template variables of that row, over the run's); an
``enable_thinking`` column (verl's SFT ``enable_thinking_key``) is that one variable.
``row_template_args`` checks and returns them; ``Prompt.meta`` keeps them for ``encode_prompt``. Chat messages keep
every field the template may read (``tool_calls``, ``name``, ``tool_call_id``, ``reasoning_content``, ...); an
assistant message that calls tools may have no content.

``task.prompt_truncation`` (``left`` / ``right`` / ``middle``) cuts the encoded ids of a longer prompt to
``task.max_prompt_tokens`` (``cut_prompt``, as verl's and TRL's loaders cut them); the limit rides on the
tokenizer object as the template kwargs do (``apply_prompt_truncation``), so every ``encode_prompt`` of the run
cuts alike. SFT rows of ``cold_start.data`` are never cut (``cut=False``; ``cold_start.max_length`` bounds them).

``stop_token_ids(tokenizer, model)``: generation ends at any of the tokenizer's EOS and the
model's ``generation_config.eos_token_id`` (an int or a list, as instruct models ship it).
``cut_at_stop_strings``: optional stop strings, applied to the decoded completion.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minirl.types import Completion, Prompt

CHAT_MODES = ("auto", "plain")
KWARGS_ATTRIBUTE = "minirl_chat_template_kwargs"
TRUNCATION_ATTRIBUTE = "minirl_prompt_truncation"


class ChatTemplateError(ValueError):
    """The tokenizer cannot render a conversational prompt; one line naming the fix."""


def encode_prompt(tokenizer: Any, prompt: Prompt, *, cut: bool = True) -> list[int]:
    """The token ids of ``prompt`` as the model sees it (module docstring); ``cut``: as the run's
    ``task.prompt_truncation`` cuts them."""
    if prompt.messages is not None:
        extra = row_template_args(prompt.meta, "prompt") if prompt.meta else {}
        prefilled = prompt.messages[-1]["role"] == "assistant"  # TRL: continue it, no generation prompt
        if prefilled:
            extra["continue_final_message"] = True
        text = render_chat(tokenizer, prompt.messages, add_generation_prompt=not prefilled, extra=extra)
        ids = encode_text(tokenizer, text, add_special_tokens=False)
    else:
        ids = encode_text(tokenizer, prompt.text, add_special_tokens=True)
    return cut_prompt(ids, *getattr(tokenizer, TRUNCATION_ATTRIBUTE, (None, "none"))) if cut else ids


def cut_prompt(ids: list[int], max_tokens: int | None, side: str) -> list[int]:
    """``ids`` cut to ``max_tokens`` from the ``side`` given (``task.prompt_truncation``; verl's ``left`` / ``right`` /
    ``middle``, whose middle keeps the first ``max_tokens // 2`` and the rest from the end); unchanged if it fits."""
    if side == "none" or max_tokens is None or len(ids) <= max_tokens:
        return ids
    if side == "left":
        return ids[len(ids) - max_tokens:]
    if side == "right":
        return ids[:max_tokens]
    if side == "middle":
        head = max_tokens // 2
        return ids[:head] + ids[len(ids) - (max_tokens - head):]
    raise ValueError(f"prompt truncation side must be none, left, right or middle (got {side!r})")


def apply_prompt_truncation(tokenizer: Any, max_tokens: int | None, side: str) -> None:
    """``task.prompt_truncation``: every later ``encode_prompt`` with ``tokenizer`` cuts to ``max_tokens``."""
    setattr(tokenizer, TRUNCATION_ATTRIBUTE, (max_tokens, side))


def render_chat(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool = True,
                extra: dict[str, Any] | None = None) -> str:
    """``messages`` through the tokenizer's chat template, as text; ``extra``: a row's ``row_template_args``."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            "a conversational prompt needs a chat template: the tokenizer has none; set task.chat_template to a "
            "Jinja template file, or task.chat_template=plain to feed the messages as plain text"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs(tokenizer, extra))


def template_kwargs(tokenizer: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's ``task.chat_template_kwargs``, as ``apply_chat_setting`` left them on ``tokenizer``, under a row's
    own ``extra`` (``row_template_args``: its tools and template variables)."""
    return {**(getattr(tokenizer, KWARGS_ATTRIBUTE, None) or {}), **(extra or {})}


def row_template_args(row: dict[str, Any], where: str) -> dict[str, Any]:
    """A data row's ``tools``, ``chat_template_kwargs`` and ``enable_thinking`` columns as ``apply_chat_template``
    keywords (module docstring); ``ValueError`` naming ``where`` and the column when one has the wrong shape."""
    args: dict[str, Any] = {}
    thinking = row.get("enable_thinking")
    if thinking is not None:
        if not isinstance(thinking, bool):
            raise ValueError(f'{where}: field "enable_thinking" must be true or false')
        args["enable_thinking"] = thinking
    kwargs = row.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
            raise ValueError(f'{where}: field "chat_template_kwargs" must be an object of template variables')
        args.update({key: value for key, value in kwargs.items() if value is not None})
    tools = row.get("tools")
    if isinstance(tools, str) and tools.strip():
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise ValueError(f'{where}: field "tools" is a string but not JSON (a list of function schemas)') from None
    if tools is not None and not (isinstance(tools, str) and not tools.strip()):
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise ValueError(f'{where}: field "tools" must be a list of function schemas (objects)')
        args["tools"] = tools  # an empty list too: this row is offered no tools (apply_chat_template's tools=[])
    return args


def encode_text(tokenizer: Any, text: str, *, add_special_tokens: bool) -> list[int]:
    """``text`` encoded; a BOS the tokenizer adds in front of a text that starts with BOS is dropped."""
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if add_special_tokens and bos and bos_id is not None and text.startswith(bos) and ids[:2] == [bos_id, bos_id]:
        ids = ids[1:]
    return ids


def flatten_messages(messages: Sequence[dict]) -> str:
    """A conversation as plain text: the message contents, one per line (none for a tool call's)."""
    return "\n".join(str(message.get("content") or "") for message in messages)


def apply_chat_setting(tokenizer: Any, setting: str, kwargs: dict[str, Any] | None = None) -> None:
    """``task.chat_template``: a template file becomes the tokenizer's ``chat_template``; ``task.chat_template_kwargs``
    ride on the tokenizer object for every rendering (an attribute ``save_pretrained`` does not write)."""
    setattr(tokenizer, KWARGS_ATTRIBUTE, dict(kwargs or {}))
    if setting in CHAT_MODES:
        return
    path = Path(setting)
    if not path.is_file():
        raise ChatTemplateError(f"task.chat_template: {setting!r} is not 'auto', 'plain' or a template file")
    tokenizer.chat_template = path.read_text(encoding="utf-8")


def prepare_prompts(prompts: list[Prompt], setting: str) -> list[Prompt]:
    """``task.chat_template=plain``: conversational prompts become their plain text."""
    if setting != "plain":
        return prompts
    for prompt in prompts:
        prompt.messages = None
    return prompts


def stop_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """The tokenizer's EOS id and the model's ``generation_config.eos_token_id`` (int or list), once each."""
    ids: list[int] = []
    sources = [getattr(tokenizer, "eos_token_id", None),
               getattr(getattr(model, "generation_config", None), "eos_token_id", None)]
    for source in sources:
        for value in source if isinstance(source, (list, tuple)) else [source]:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    if not ids:
        raise ChatTemplateError("the tokenizer has no eos token and the model's generation_config names none")
    return ids


def cut_at_stop_strings(completion: Completion, tokenizer: Any, stops: Sequence[str]) -> Completion:
    """``completion`` ended at the first token whose decoded prefix contains a stop string.

    The kept tokens are a prefix of what was sampled, so their ``logp_rollout`` stay exact; the
    tokens after the stop are dropped (finish reason ``eos``, as for a stop token).
    """
    if not stops or not any(stop in completion.text for stop in stops):
        return completion
    ids = completion.completion_ids
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if any(stop in text for stop in stops):
            break
    completion.completion_ids = list(ids[:end])
    completion.logp_rollout = completion.logp_rollout[:end]
    if completion.sampled_at_steps is not None:  # a partial rollout's response (minirl.partial_rollout)
        completion.sampled_at_steps = completion.sampled_at_steps[:end]
    completion.text = tokenizer.decode(completion.completion_ids, skip_special_tokens=True)
    completion.finish_reason = "eos"
    if completion.routes is not None:
        completion.routes = completion.routes[: len(completion.prompt_ids) + end].clone()
        completion.routes[-1] = -1  # the last token is never fed while sampling (types.Completion)
    return completion
