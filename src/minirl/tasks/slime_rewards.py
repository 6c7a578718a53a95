"""slime's built-in ``--rm-type`` scorers (``slime/rollout/rm_hub``), as minirl reward functions.

``rm_hub(args, sample)`` is slime's ``async_rm`` dispatch, called with slime's convention
(``minirl.tasks.reward_functions``): what ``minirl config from-slime`` writes for ``--rm-type``. The row's
``metadata["rm_type"]`` overrides ``args.rm_type`` (slime's multi-domain data); a ``boxed_`` prefix scores the
response's last ``\\boxed{}`` answer instead of the whole response (``boxed_f1``, ``boxed_gpqa``); then ``dapo``,
``math``, ``deepscaler``, ``f1``, ``gpqa``, ``random`` or ``remote_rm`` (your reward server at ``--rm-url``). slime's
``ifbench`` and ``opencua_click`` are not here: a row asking for one is one error line naming it.

``dapo``, ``math``, ``deepscaler`` and ``f1`` are also verl-style ``compute_score`` functions: the completion's text as
``solution_str`` and the row's answer (slime's label) as ``ground_truth``.

* ``dapo``: slime's ``math_dapo_utils.compute_score``, verl's ``math_dapo`` (``minirl.tasks.verl_scores.dapo_score``):
  Minerva's check of the last 300 characters, 1.0 / -1.0, with ``acc`` logged beside it (slime reads ``score`` with
  ``--reward-key score``).
* ``math``: slime's ``grade_answer_verl``: the last ``\\boxed{}`` answer of the response (and of the label, when it
  has one) against the label; 1 or 0, and 0 without a boxed answer or with an empty label.
* ``deepscaler``: the same on the text after the response's last ``</think>`` (else after its first ``###Response``);
  0 without either.
* ``f1``: HotpotQA's answer F1 over words (lower case, punctuation and articles removed): 0 when either side is
  ``yes`` / ``no`` / ``noanswer`` and they differ, or nothing is shared.
* ``gpqa``: a multiple-choice letter. The correct letter is the metadata's ``correct_letter``, a one-letter label, a
  label index, or the choice (metadata ``choices``) whose text is the label; the response's letter is the first of
  "answer is X", "X is correct", "final answer: X", else its last standalone capital letter among the valid ones
  (metadata ``valid_letters``, else A.. for each choice, else A–J), read after ``</think>``. Without a letter on both
  sides, 1 when the correct choice's text (or metadata ``correct_answer`` / ``answer_text``, or a longer label)
  appears in the response as whole words.

slime grades ``math`` and ``deepscaler`` with DeepScaleR's rules (``mathd`` normalisation, then sympy); these use
``math_verify`` (``minirl.tasks.jsonl.math_equivalent``): the same verdict on numbers and on most LaTeX answers, not on
every one. The translation says so in its header.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import string
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

from minirl.tasks.jsonl import math_equivalent
from minirl.tasks.verl_scores import dapo_score, last_boxed, unbox


def dapo(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """``--rm-type dapo``: 1.0 / -1.0 (and ``acc``)."""
    scored = dapo_score(solution_str, str(ground_truth))
    return {"score": scored["score"], "acc": float(scored["acc"])}


def math(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``--rm-type math``: 1.0 when the response's last boxed answer equals the label, else 0.0."""
    return 1.0 if _boxed_matches(solution_str, ground_truth) else 0.0


def deepscaler(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``--rm-type deepscaler``: ``math`` on what follows the response's last ``</think>`` (0.0 without one)."""
    if "</think>" in solution_str:
        solution = solution_str.split("</think>")[-1]
    elif "###Response" in solution_str:  # slime's: what follows the first marker, up to a second one
        solution = solution_str.split("###Response")[1]
    else:
        return 0.0
    return 1.0 if _boxed_matches(solution, ground_truth) else 0.0


def _boxed_matches(response: str, label: Any) -> bool:
    """slime's ``grade_answer_verl`` with ``math_verify`` as the judge."""
    label = "" if label is None else str(label)
    if not label:
        return False
    if "\\boxed" in label:
        boxed_label = last_boxed(label)
        label = unbox(boxed_label, spaced=False) if boxed_label is not None else label
    boxed = last_boxed(response)
    if boxed is None:
        return False
    return math_equivalent(unbox(boxed, spaced=False), label)


def f1(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """``--rm-type f1``: HotpotQA's word F1 of the response against the label."""
    return f1_precision_recall(solution_str, "" if ground_truth is None else str(ground_truth))[0]


def f1_precision_recall(prediction: str, truth: str) -> tuple[float, float, float]:
    """HotpotQA's answer (F1, precision, recall) over normalised words."""
    said, meant = _normalised_answer(prediction), _normalised_answer(truth)
    if said != meant and ({said, meant} & {"yes", "no", "noanswer"}):
        return 0.0, 0.0, 0.0
    said_words, meant_words = said.split(), meant.split()
    shared = sum((Counter(said_words) & Counter(meant_words)).values())
    if shared == 0:
        return 0.0, 0.0, 0.0
    precision, recall = shared / len(said_words), shared / len(meant_words)
    return 2 * precision * recall / (precision + recall), precision, recall


def _normalised_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD's and HotpotQA's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


GPQA_LETTERS = tuple(string.ascii_uppercase[:10])
_GPQA_PATTERNS = (r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)",
                  r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])")


def gpqa(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None,
         metadata: dict[str, Any] | None = None) -> float:
    """``--rm-type gpqa``: 1.0 when the response picks the correct choice, else 0.0 (the module's docstring)."""
    metadata = dict(metadata or {})
    choices = metadata.get("choices")
    choices = list(choices.values()) if isinstance(choices, dict) else list(choices) if choices is not None else []
    if metadata.get("valid_letters"):
        letters = [str(letter).upper() for letter in metadata["valid_letters"]]
    else:
        letters = list(string.ascii_uppercase[: len(choices)]) if choices else list(GPQA_LETTERS)
    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label = ground_truth.strip() if isinstance(ground_truth, str) else None
    one_letter = label is not None and len(label) == 1 and label.upper() in letters
    if one_letter and not correct:
        correct = label.upper()  # type: ignore[union-attr]
    elif isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool) and 0 <= int(ground_truth) < len(letters):
        correct = letters[int(ground_truth)]
    answers: list[str] = []
    if not correct and choices and label:
        for index, choice in enumerate(choices):
            if _gpqa_text(str(choice)) == _gpqa_text(label):
                correct = letters[index]
                answers.append(str(choice))  # slime's metadata["correct_answer"], which it sets here
                break
    response = solution_str.rsplit("</think>", 1)[-1] if solution_str else ""
    picked = _gpqa_letter(response, letters)
    if picked and correct:
        return 1.0 if picked == correct else 0.0
    if correct and correct in letters and letters.index(correct) < len(choices):
        answers.insert(0, str(choices[letters.index(correct)]))
    answers += [str(metadata[key]) for key in ("correct_answer", "answer_text") if metadata.get(key)]
    if label and not one_letter:
        answers.append(label)
    words = f" {_gpqa_text(response)} "
    if any(target and f" {target} " in words for target in map(_gpqa_text, answers)):
        return 1.0
    if picked and not correct and label:
        return 1.0 if picked == label.upper() else 0.0
    return 0.0


def _gpqa_text(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def _gpqa_letter(response: str, letters: list[str]) -> str | None:
    """The option letter a response picks: the first pattern that matches a valid letter, else its last standalone
    valid capital letter."""
    for pattern in _GPQA_PATTERNS:
        match = re.search(pattern, response, flags=re.IGNORECASE)
        if match and match.group(1).upper() in letters:
            return match.group(1).upper()
    return next((letter for letter in reversed(re.findall(r"\b([A-Z])\b", response)) if letter in letters), None)


SCORERS: dict[str, Callable[[str, Any, dict[str, Any]], Any]] = {
    "dapo": lambda response, label, metadata: dapo(None, response, label),
    "math": lambda response, label, metadata: math(None, response, label),
    "deepscaler": lambda response, label, metadata: deepscaler(None, response, label),
    "f1": lambda response, label, metadata: f1(None, response, label),
    "gpqa": lambda response, label, metadata: gpqa(None, response, label, metadata=metadata),
    "random": lambda response, label, metadata: float(random.randint(0, 1)),
}
"""slime's rule-based ``--rm-type`` scorers minirl has, by name: ``(response, label, metadata) -> reward``."""


REMOTE_RM_DEADLINE_S = 9.0
"""``remote_rm``'s budget (seconds, all tries and waits) when its args carry no ``rm_deadline_s`` and it runs outside a
reward worker: under minirl's default ``task.reward_timeout_s`` (10 s). In a worker the budget is the runner's timeout
less ``REMOTE_RM_MARGIN_S`` (``reward_runner.TIMEOUT_ENV``), so that a dead server is named before the runner's generic
timeout fires, whatever ``task.reward_timeout_s`` is."""

REMOTE_RM_MARGIN_S = 1.0
"""What ``remote_rm`` leaves of its worker's timeout for its failure line to get back."""

SLIME_RM_DEADLINE_S = 170.0
"""The ``rm_deadline_s`` ``minirl config from-slime`` gives ``--rm-type remote_rm``: slime's 10 tries of a request that
fails at once (its waits add up to 151-160 s) or one request of slime's 120 s timeout fit in it."""

SLIME_RM_TIMEOUT_S = SLIME_RM_DEADLINE_S + 10.0
"""The ``task.reward_timeout_s`` of a translated ``remote_rm``: over its budget, so that the runner never kills the call
before ``remote_rm`` says which server failed and how."""


def _worker_budget() -> float:
    """``remote_rm``'s default budget: its reward worker's timeout less ``REMOTE_RM_MARGIN_S`` (at least half of the
    timeout), else ``REMOTE_RM_DEADLINE_S``."""
    from minirl.tasks.reward_runner import TIMEOUT_ENV

    timeout = os.environ.get(TIMEOUT_ENV)
    if not timeout:
        return REMOTE_RM_DEADLINE_S
    return max(float(timeout) - REMOTE_RM_MARGIN_S, float(timeout) / 2)


def remote_rm(args: Any, sample: Any, *, max_retries: int = 10, timeout_s: float = 120.0,
              deadline_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> Any:
    """slime's ``remote_rm`` (``--rm-type remote_rm --rm-url URL``): POSTs ``{"prompt", "response", "label"}`` as JSON
    to ``args.rm_url`` and returns the JSON the server answers (a number, or a dict whose ``--reward-key`` entry is the
    reward). A failed request (an HTTP error status, a refused connection, no answer within ``timeout_s``) is retried
    after min(2^attempt, 30) s plus up to 1 s, ``max_retries`` tries in all, as slime's, within a budget for all tries
    and waits: ``deadline_s``, else ``args.rm_deadline_s`` (what the translation sets), else in a reward worker its
    timeout less ``REMOTE_RM_MARGIN_S``, else ``REMOTE_RM_DEADLINE_S``.
    No request outlasts the budget, and a wait that would reach it is not begun: the budget is kept under
    ``task.reward_timeout_s``, so a dead server is one line of its own (its URL, ``--rm-url``, the last failure, the
    tries and seconds spent) instead of the runner's generic timeout. A 200 answer that is not JSON is not retried."""
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("rm_type remote_rm: set --rm-url (the reward server slime posts each response to)")
    budget = float(deadline_s if deadline_s is not None else getattr(args, "rm_deadline_s", None) or _worker_budget())
    body = json.dumps({"prompt": sample.prompt, "response": sample.response, "label": sample.label}).encode()
    start = clock()
    for attempt in range(max_retries):
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        request_s = min(timeout_s, max(start + budget - clock(), 0.01))  # no request outlasts the budget
        try:
            with urllib.request.urlopen(request, timeout=request_s) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:  # the server is there and says no (503 while it loads, 500, ...)
            exc.close()
            failure = f"the reward server at {url} (--rm-url) answers HTTP {exc.code} {exc.reason}"
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # nothing there, or no answer
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            said = (f"no answer within {request_s:.1f} s" if isinstance(reason, TimeoutError)
                    else " ".join(str(reason).split()) or type(reason).__name__)
            failure = f"nothing answers at {url} (--rm-url): {said}"
        else:
            try:
                return json.loads(text)
            except ValueError:
                raise RuntimeError(f"remote_rm: the reward server at {url} (--rm-url) answered {text[:60]!r}, "
                                   "not JSON") from None
        pause = min(2 ** attempt, 30) + random.random()
        over_budget = attempt + 1 < max_retries and clock() + pause >= start + budget
        if attempt + 1 >= max_retries or over_budget:
            tries = f"{attempt + 1} tr{'y' if attempt == 0 else 'ies'} in {clock() - start:.1f} s"
            raise RuntimeError(f"remote_rm: {failure}, {tries}"
                               + (f", stopped by its {budget:g} s budget (rm_deadline_s in its kwargs)" if over_budget else ""))
        sleep(pause)
    raise AssertionError("unreachable")  # the loop returns or raises


def rm_hub(args: Any, sample: Any) -> Any:
    """slime's ``async_rm`` for a rule-based ``--rm-type`` (called as slime calls it: ``(args, sample)``)."""
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    kind = str(metadata.get("rm_type") or args.rm_type or "").strip()
    if not kind:
        raise ValueError(f"the row with prompt {_opening(sample.prompt)!r} has no rm_type: pass --rm-type "
                         f"({', '.join(SCORERS)}) or set its {getattr(args, 'metadata_key', None) or 'metadata'}.rm_type")
    response = sample.response
    if kind.startswith("boxed_"):
        boxed = last_boxed(response)
        response = unbox(boxed, spaced=False) if boxed is not None else ""
        kind = kind[len("boxed_"):]
    if kind == "remote_rm":  # the whole sample, as slime posts it (even after a boxed_ prefix)
        return remote_rm(args, sample)
    if kind not in SCORERS:
        raise ValueError(f"rm_type {kind!r}: minirl has slime's {', '.join(SCORERS)} and remote_rm (boxed_ prefix "
                         "allowed); write another as a reward function")
    return SCORERS[kind](response, sample.label, metadata)


def _opening(prompt: Any, width: int = 40) -> str:
    """A row's prompt (a chat's last message) on one line, cut to ``width`` characters: which row an error is about."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", "")
    text = " ".join(str(prompt).split())
    return text if len(text) <= width else text[:width - 3] + "..."
