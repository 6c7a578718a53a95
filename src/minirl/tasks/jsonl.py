"""Prompts from a data file, with an exact-match or math-equivalence verifier.

File format: JSONL (one JSON object per line), JSON, Parquet or a ``datasets`` directory
(``minirl.tasks.data``); each row ``{"prompt": str | messages, "answer": str | number}`` (the
column names are ``task.prompt_column`` / ``task.answer_column``). A prompt may be a chat, TRL's
conversational form ``[{"role": "user", "content": "..."}]`` (``Prompt.messages``; rendered with
the chat template, ``minirl.tasks.chat``). A dotted answer column (``reward_model.ground_truth``)
reads a field of an object column; a row in verl's layout (``{"data_source", "prompt": messages,
"reward_model": {"ground_truth": ...}, "extra_info": {...}}``) needs no mapping: without an
``answer`` column the default reads ``reward_model.ground_truth``. With user reward functions (no built-in
verifier) an answer may also be a list or an object: its text is then its JSON, and the column keeps it whole
(verl's ``compute_score`` gets it as stored). Any other columns are kept in
``Prompt.meta`` and reach user reward functions as keywords. A numeric answer (JSON int or float, not a boolean) becomes
its Python ``str()`` (``7`` -> ``"7"``, ``0.5`` -> ``"0.5"``, ``2.50`` -> ``"2.5"``): give a
string when the exact spelling matters. Blank lines are ignored (they hold no row). A bad row (not
UTF-8, not JSON, not an object, a field missing, empty or of the wrong type, a chat message without
string "role" and "content", a prompt longer than
``max_prompt_chars`` characters or ``max_prompt_tokens`` tokens) stops the load with
``TaskDataError``, whose message names the file and line, e.g.
``data/train.jsonl:7: field "answer" is missing``; with ``on_bad_row="skip"`` it is skipped and
counted instead (``JsonlTask.skipped_rows``, the messages in ``skipped_reasons``), never silently.
A missing, unreadable or directory path, or a file left with no rows, is always an error.

Answer extraction from a completion (``extract_answer``), first rule that applies:
    1. the contents of the last ``\\boxed{...}`` (braces balanced);
    2. the text after the last ``####``;
    3. the text after the last ``answer:`` / ``ans:`` / ``final answer:`` (any case);
    4. the last non-empty line.
The result is whitespace-stripped. ``reward="exact"`` compares it with the stripped reference
answer; ``reward="math_verify"`` asks ``math_verify`` whether both are mathematically equal
("1/2", "0.5" and "\\frac{1}{2}" all match). Its signal-based timeouts only work in the main
thread, so off the main thread they are turned off.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from minirl.tasks.chat import flatten_messages, row_template_args
from minirl.types import Prompt

RewardKind = Literal["exact", "math_verify"]
REWARD_KINDS: tuple[str, ...] = ("exact", "math_verify")
OnBadRow = Literal["error", "skip"]
ON_BAD_ROW: tuple[str, ...] = ("error", "skip")
MATH_VERIFY_TIMEOUT_S = 5
MAX_CHARS_PER_TOKEN = 64
"""A prompt longer than this many characters per token of room is too long without tokenizing it
(BPE vocabularies' longest tokens are far shorter; a byte or character tokenizer has one)."""

_MARKER_PATTERN = re.compile(r"(?:final answer|answer|ans)\s*:", re.IGNORECASE)


class TaskDataError(Exception):
    """A bad data file or row; ``str()`` is one line naming the file (and line)."""


# --- answer extraction ----------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` with balanced braces; ``None`` if there is none."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth = 0
        for position in range(start + len("\\boxed"), len(text)):
            if text[position] == "{":
                depth += 1
            elif text[position] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len("\\boxed{") : position]
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier one
    return None


def extract_answer(completion: str) -> str:
    """The final answer in a free-form completion (rules in the module docstring)."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    if "####" in completion:
        return completion.rsplit("####", 1)[1].strip()
    markers = list(_MARKER_PATTERN.finditer(completion))
    if markers:
        return completion[markers[-1].end() :].strip()
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- verifiers ------------------------------------------------------------------------------------


def exact_match(predicted: str, answer: str) -> bool:
    return predicted.strip() == answer.strip()


def math_equivalent(predicted: str, answer: str) -> bool:
    """Mathematical equality by ``math_verify``; exact match when the reference does not parse."""
    from math_verify import parse, verify

    # signal.alarm (math_verify's timeout) raises off the main thread: no timeout there.
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None

    def parse_math(text: str) -> list:
        text = text.strip()
        if not text:
            return []
        # Bare LaTeX ("\frac{1}{2}", "x+1") only parses inside math delimiters.
        return parse(text if "$" in text else f"${text}$", parsing_timeout=timeout)

    gold = parse_math(answer)
    if not gold:
        return exact_match(predicted, answer)
    target = parse_math(predicted)
    if not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout))


# --- the task -------------------------------------------------------------------------------------


class JsonlTask:
    """A ``Task`` over JSONL rows; eval is ``eval_path`` or a seeded ``eval_fraction`` of rows."""

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        eval_path: str | Path | Sequence[str | Path] | None = None,
        eval_fraction: float = 0.1,
        reward: RewardKind = "exact",
        seed: int = 0,
        name: str | None = None,
        on_bad_row: OnBadRow = "error",
        max_prompt_chars: int | None = None,
        max_prompt_tokens: int | None = None,
        count_tokens: Callable[[Prompt], int] | None = None,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        answer_required: bool = True,
        answer_named: bool = False,
        environment_prompts: bool = False,
        plain_chat: bool = False,
        dataset_config: str | None = None,
        train_split: str = "train",
        eval_split: str | None = None,
        system_prompt: str | None = None,
        chat_prompts: bool = False,
    ) -> None:
        if reward not in REWARD_KINDS:
            raise ValueError(f"unknown JSONL reward {reward!r}; choose one of: {', '.join(REWARD_KINDS)}")
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        paths = _paths(path)
        self.path = paths[0]
        self.name = name or Path(self.path).stem
        if eval_path is None and eval_split is None and _verifiers_eval(paths):
            eval_split = "eval"  # a verifiers environment's eval_dataset is its held-out set
        self.reward_kind = reward
        self.skipped_reasons: list[str] = []
        """One ``file:line: reason`` message per skipped row (``on_bad_row="skip"``)."""
        read: dict[str, Any] = dict(
            on_bad_row=on_bad_row, max_prompt_chars=max_prompt_chars, max_prompt_tokens=max_prompt_tokens,
            count_tokens=count_tokens, skipped=self.skipped_reasons,
            columns=ColumnMap(prompt_column, answer_column, answer_required, plain_chat, system_prompt, chat_prompts,
                              answer_named, environment_prompts),
        )
        rows = [row for p in paths for row in read_jsonl_prompts(p, split=train_split, config=dataset_config, **read)]
        if eval_path is not None or eval_split is not None:  # held-out files, or a split of the dataset directories
            held_out = _paths(eval_path) if eval_path is not None else paths
            self._train = rows
            self._eval = [row for p in held_out
                          for row in read_jsonl_prompts(p, split=eval_split or "train", config=dataset_config, **read)]
        else:
            self._train, self._eval = _split(rows, eval_fraction, seed, self.path)

    @property
    def skipped_rows(self) -> int:
        """Rows skipped as bad (train and eval files); log it as ``data/skipped_rows``."""
        return len(self.skipped_reasons)

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def extract_answer(self, completion: str) -> str:
        return extract_answer(completion)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return (exact_reward if self.reward_kind == "exact" else math_verify_reward)(prompt.text, completion, prompt.answer)


def _completion_text(completion: Any) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def exact_reward(prompt: Any, completion: Any, answer: str, **kwargs: Any) -> float:
    """``task.reward: exact`` as a reward function (to weigh it beside others in ``task.reward_functions``): 1.0 when
    the completion's final answer (``extract_answer``) is the reference, character for character."""
    return 1.0 if exact_match(extract_answer(_completion_text(completion)), answer) else 0.0


def math_verify_reward(prompt: Any, completion: Any, answer: str, **kwargs: Any) -> float:
    """``task.reward: math_verify`` as a reward function: 1.0 when the final answer equals the reference mathematically."""
    return 1.0 if math_equivalent(extract_answer(_completion_text(completion)), answer) else 0.0


def _paths(given: str | Path | Sequence[str | Path]) -> list[Any]:
    """One data path or several (``task.path`` as a list: their rows one after another); a ``verifiers:ENV_ID`` stays
    text (``minirl.tasks.verifiers_env``)."""
    from minirl.tasks.verifiers_env import is_spec

    paths = [p if is_spec(p) else Path(p) for p in ([given] if isinstance(given, (str, Path)) else given)]
    if not paths:
        raise TaskDataError("task.path: an empty list (give a data file or directory)")
    return paths


def _verifiers_eval(paths: list[Any]) -> bool:
    """Every path a verifiers environment that has an ``eval_dataset``."""
    from minirl.tasks import verifiers_env

    try:
        return all(verifiers_env.is_spec(p) for p in paths) and all(verifiers_env.has_eval(p) for p in paths)
    except verifiers_env.VerifiersError as error:
        raise TaskDataError(str(error)) from None


def _split(rows: list[Prompt], eval_fraction: float, seed: int, path: Path | str) -> tuple[list[Prompt], list[Prompt]]:
    num_eval = round(eval_fraction * len(rows))
    if eval_fraction > 0 and num_eval == 0 and len(rows) >= 2:
        num_eval = 1
    if len(rows) - num_eval < 1:
        raise TaskDataError(f"{path}: {len(rows)} row(s) leave no training rows after eval_fraction {eval_fraction}")
    if eval_fraction > 0 and num_eval == 0:
        raise TaskDataError(f"{path}: {len(rows)} row: none left for evaluation (task.eval_fraction {eval_fraction}); "
                            "add rows or give task.eval_path")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    eval_rows = sorted(order[:num_eval])
    train_rows = sorted(order[num_eval:])
    return [rows[index] for index in train_rows], [rows[index] for index in eval_rows]


def read_jsonl_prompts(
    path: Path | str,
    *,
    on_bad_row: OnBadRow = "error",
    max_prompt_chars: int | None = None,
    max_prompt_tokens: int | None = None,
    count_tokens: Callable[[Prompt], int] | None = None,
    skipped: list[str] | None = None,
    columns: ColumnMap | None = None,
    split: str = "train",
    config: str | None = None,
) -> list[Prompt]:
    """Every row of ``path`` (JSONL, JSON, Parquet or a ``datasets`` directory, ``minirl.tasks.data``)
    as a ``Prompt``; ``TaskDataError`` naming file and line (or row) otherwise.

    With ``on_bad_row="skip"`` a bad row's message is appended to ``skipped`` instead. A prompt
    longer than ``max_prompt_chars`` characters, or ``max_prompt_tokens`` tokens as counted by
    ``count_tokens(prompt)``, makes a bad row. ``split`` / ``config``: which of a dataset directory's.
    """
    from minirl.tasks.data import iter_rows

    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row must be one of {', '.join(map(repr, ON_BAD_ROW))}, got {on_bad_row!r}")
    if max_prompt_tokens is not None and count_tokens is None:
        raise ValueError("max_prompt_tokens needs count_tokens (a function prompt -> number of tokens)")
    columns = columns or ColumnMap()
    prompts: list[Prompt] = []
    bad: list[str] = []
    for where, row in iter_rows(path, split=split, config=config):
        try:
            if isinstance(row, TaskDataError):
                raise row
            prompt = _row_to_prompt(row, where, columns)
            _check_length(prompt, where, max_prompt_chars, max_prompt_tokens, count_tokens)
        except TaskDataError as error:
            if on_bad_row == "error":
                raise error from None
            bad.append(str(error))
        else:
            prompts.append(prompt)
    if skipped is not None:
        skipped.extend(bad)
    if not prompts:
        if bad:
            raise TaskDataError(f"{path}: no usable rows ({len(bad)} bad row(s) skipped; the first: {bad[0]})")
        raise TaskDataError(f"{path}: no rows (expected one JSON object per line)")
    return prompts


TOKEN_LIMIT = "task.max_prompt_tokens, or the model's context less rollout.max_new_tokens"


def _check_length(
    prompt: Prompt, where: str, max_chars: int | None, max_tokens: int | None, count_tokens: Callable[[Prompt], int] | None
) -> None:
    text = prompt.text
    if max_chars is not None and len(text) > max_chars:
        raise TaskDataError(f"{where}: prompt is {len(text)} characters, longer than task.max_prompt_chars={max_chars}")
    if max_tokens is not None and count_tokens is not None:
        if len(text) > max_tokens * MAX_CHARS_PER_TOKEN:  # bounded work: a 30 MB row is never tokenized
            raise TaskDataError(f"{where}: prompt is {len(text)} characters, more than {max_tokens} tokens could hold "
                                f"(at most {MAX_CHARS_PER_TOKEN} characters a token; {TOKEN_LIMIT})")
        tokens = count_tokens(prompt)
        if tokens > max_tokens:
            raise TaskDataError(f"{where}: prompt is {tokens} tokens, longer than {max_tokens} ({TOKEN_LIMIT})")


@dataclass(frozen=True)
class ColumnMap:
    """Which data columns hold the prompt and the answer (``task.prompt_column`` / ``answer_column``);
    ``answer_required=False`` lets rows without one through (user reward functions may not need it), unless the
    column is named (``answer_named``: ``task.answer_column`` given);
    ``plain_chat``: chat prompts become their plain text (``task.chat_template=plain``); ``system_prompt`` /
    ``chat_prompts``: text prompts become chats (with that system message first; ``task.system_prompt``)."""

    prompt: str = "prompt"
    answer: str = "answer"
    answer_required: bool = True
    plain_chat: bool = False
    system_prompt: str | None = None
    chat_prompts: bool = False
    answer_named: bool = False
    environment_prompts: bool = False  # task.environment: a row's prompt may be missing or empty (its reset() gives it)


def _row_to_prompt(row: Any, where: str, columns: ColumnMap = ColumnMap()) -> Prompt:
    prompt_key, answer_key = columns.prompt, columns.answer
    if not isinstance(row, dict):
        raise TaskDataError(
            f'{where}: expected a JSON object with "{prompt_key}" and "{answer_key}", got {_json_type(row)}'
        )
    if prompt_key not in row and columns.environment_prompts:  # TRL: an environment's reset() gives the prompt
        row = {**row, prompt_key: [{"role": "user", "content": ""}]}
    if prompt_key not in row:
        raise TaskDataError(f'{where}: field "{prompt_key}" is missing')
    answer_key = _answer_key(row, answer_key)
    found, answer = lookup_column(row, answer_key)
    if not found and (columns.answer_required or columns.answer_named):  # a column named is every row's (slime's
        raise TaskDataError(f'{where}: field "{answer_key}" is missing')  # --label-key: a KeyError there)
    messages = _prompt_messages(row[prompt_key], where, prompt_key, columns)
    prompt = row[prompt_key] if messages is None else flatten_messages(messages)
    if not columns.answer_required and (answer is None or isinstance(answer, (list, dict))):
        # only user reward functions read it: a structured reference (verl's ground_truth may be a list or an
        # object, e.g. {"target": [...]}) is kept whole in its column and shown to them as JSON text here
        answer_text = "" if answer is None else json.dumps(answer, ensure_ascii=False)
    else:
        answer_text = _answer_text(answer, where, answer_key)
    extra = {key: value for key, value in row.items() if key not in (prompt_key, answer_key)}
    if found and ((isinstance(answer, (int, float)) and not isinstance(answer, bool))
                  or (isinstance(answer, (list, dict)) and answer_key in row)):
        extra[answer_key] = answer  # TRL and slime pass a column as stored: a number, a list or an object stays one
    media = next((key for key in MEDIA_COLUMNS if _holds_media(extra.get(key))), None)
    if media is not None:
        raise TaskDataError(f'{where}: field "{media}" holds images or videos; minirl trains text models (drop the '
                            "column to train on the text alone)")
    try:  # a row's own tools and template variables (TRL's columns), checked now; JSON-string tools read once
        tools = row_template_args(extra, where).get("tools")
    except ValueError as exc:
        raise TaskDataError(str(exc)) from None
    if tools is not None:
        extra["tools"] = tools
    return Prompt(text=prompt, answer=answer_text, uid=where, meta={"source": where, **extra},
                  messages=None if columns.plain_chat else messages)


def _prompt_messages(prompt: Any, where: str, key: str, columns: ColumnMap) -> list[dict] | None:
    """A row's prompt as chat messages (None: plain text), with ``task.system_prompt`` first where it has none."""
    if isinstance(prompt, list):
        messages = check_messages(prompt, where, key)
        if not flatten_messages(messages).strip() and not columns.environment_prompts:  # a reset() may give it all
            raise TaskDataError(f'{where}: field "{key}" is empty')
    elif isinstance(prompt, str):
        if not prompt.strip():
            raise TaskDataError(f'{where}: field "{key}" is empty')
        if columns.system_prompt is None and not columns.chat_prompts:
            return None
        messages = [{"role": "user", "content": prompt}]
    else:
        raise TaskDataError(f'{where}: field "{key}" must be a string or a list of chat messages, got {_json_type(prompt)}')
    if columns.system_prompt is not None and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": columns.system_prompt}, *messages]
    return messages


VERL_ANSWER = "reward_model.ground_truth"
"""Where verl's data files keep the reference answer (``{"reward_model": {"ground_truth": ...}}``)."""


def _answer_key(row: dict, key: str) -> str:
    """``key``, or verl's ``reward_model.ground_truth`` when ``key`` is the default ``answer`` and the row
    has no such column but verl's layout."""
    if key == "answer" and key not in row and lookup_column(row, VERL_ANSWER)[0]:
        return VERL_ANSWER
    return key


def lookup_column(row: dict, key: str) -> tuple[bool, Any]:
    """(found, value) of column ``key``; a dotted key (``reward_model.ground_truth``) walks nested objects."""
    if key in row:
        return True, row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _answer_text(answer: Any, where: str, key: str) -> str:
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise TaskDataError(f'{where}: field "{key}" must be a string or a number, got {_json_type(answer)}')
    if isinstance(answer, float) and not math.isfinite(answer):
        raise TaskDataError(f'{where}: field "{key}" must be finite, got {answer}')
    answer_text = answer if isinstance(answer, str) else str(answer)
    if not answer_text.strip():
        raise TaskDataError(f'{where}: field "{key}" is empty')
    return answer_text


MEDIA_COLUMNS = ("images", "image", "videos", "video")
"""The columns that carry a row's images or videos: verl's multimodal rows (``data.image_key`` / ``video_key``),
TRL's vision datasets."""


def _holds_media(value: Any) -> bool:
    """Whether a media column's value holds anything (not null, not an empty list or string)."""
    if value is None:
        return False
    try:
        return len(value) > 0
    except TypeError:  # one image object
        return True


def check_messages(messages: list, where: str, key: str) -> list[dict]:
    """``messages`` as chat messages (``{"role": str, "content": str, ...}``), or ``TaskDataError``. Every other
    field a template may read is kept (``tool_calls``, ``name``, ``tool_call_id``, ...), but fields that are null (a
    ``datasets`` table fills the fields of other rows' messages with nulls); a message that calls tools
    (``tool_calls``) may have no content. A content given as parts (``[{"type": "text", "text": ...}, ...]``, the
    OpenAI / TRL multimodal form) becomes its text parts joined, for a text model's template; another kind of part
    (an image) is one line."""
    if not messages:
        raise TaskDataError(f'{where}: field "{key}" is an empty list of messages')
    checked = []
    for index, message in enumerate(messages):
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            message = {**message, "content": _text_parts(message["content"], f'{where}: field "{key}" message {index}')}
        calls = isinstance(message, dict) and bool(message.get("tool_calls"))
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not (
                isinstance(message.get("content"), str) or (calls and message.get("content") is None)):
            raise TaskDataError(
                f'{where}: field "{key}" message {index} must be an object with string "role" and "content", '
                f"got {_json_type(message)}"
            )
        checked.append({name: value for name, value in message.items() if value is not None or name == "content"})
    return checked


def _text_parts(parts: list, where: str) -> str:
    """A message's content parts as one text: the text parts in order (``TaskDataError`` for any other part)."""
    texts = []
    for number, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"of type {kind!r}" if kind else _json_type(part)
            raise TaskDataError(f'{where} content part {number} is {what}: minirl trains text models (content as a '
                                'string, or parts of type "text" with a string "text")')
        texts.append(part["text"])
    return "".join(texts)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
