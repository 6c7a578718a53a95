"""verl's default rewards (``verl.utils.reward_score.default_compute_score``, verl 0.9.1), rewritten so that a verl
run with no ``custom_reward_function`` scores here as it does there: verl picks the scorer by each row's
``data_source``, and so does ``default_compute_score`` below (a verl ``compute_score``: it goes in
``task.reward_functions`` as ``minirl.tasks.verl_scores:default_compute_score``, which ``minirl config from-verl``
writes):

* ``openai/gsm8k``: the number after the last ``#### `` in the response's last 300 characters, compared as text
  with the ground truth (commas and ``$`` dropped): 1.0 or 0.0 (ReFT's scorer);
* ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``: the last ``\\boxed{}``
  (or ``\\fbox{}``) against the ground truth after Hendrycks et al.'s MATH normalisation (``\\dfrac`` -> ``\\frac``,
  units, ``0.5`` -> ``\\frac{1}{2}``, ``a/b`` -> ``\\frac{a}{b}``, ...): 1.0 or 0.0;
* ``math_dapo``, ``math``, ``math_dapo_reasoning``, ``aime*``: DAPO's scorer on the last 300 characters, the text
  after the last ``Answer:`` (else the last ``\\boxed{}``) after Minerva's normalisation: ``{"score": 1.0 or -1.0,
  "acc": bool, "pred": str}`` (``acc`` is logged as ``reward/<name>/acc``).

Other sources (prime_math's numina sets, code, geometry3k, search-R1) have no scorer here: one line naming the
``data_source``, as verl raises. Imports nothing heavy (the reward worker process uses it).
"""

from __future__ import annotations

import re
from typing import Any

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")  # and every "aime*"
TAIL_CHARS = 300  # both scorers read only the response's end


def default_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                          **kwargs: Any) -> float | dict[str, Any]:
    """verl's scorer for ``data_source`` (module docstring); ``ValueError`` for a source without one."""
    if data_source in GSM8K_SOURCES:
        return gsm8k_score(solution_str, ground_truth)
    if data_source in MATH_SOURCES:
        return math_score(solution_str, ground_truth)
    if data_source in DAPO_SOURCES or data_source.startswith("aime"):
        return dapo_score(solution_str, ground_truth)
    raise ValueError(f"verl's default reward has no scorer for data_source={data_source!r} here (gsm8k, MATH and "
                     "DAPO's are rewritten in minirl.tasks.verl_scores); give task.reward_function or reward_functions")


# ------------------------------------------------------------------------------------------------ gsm8k (ReFT)

def gsm8k_score(solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0,
                score: float = 1.0) -> float:
    """verl's ``gsm8k.compute_score``: ``score`` when the extracted number equals ``ground_truth`` (as text),
    ``format_score`` when another number was extracted, 0.0 when none."""
    answer = gsm8k_answer(solution_str, method)
    if answer is None:
        return 0.0
    return float(score if answer == ground_truth else format_score)


def gsm8k_answer(solution_str: str, method: str = "strict") -> str | None:
    """``strict``: the number after the last ``#### `` (commas and ``$`` dropped); ``flexible``: the last number
    that is not ``.``; both in the last 300 characters."""
    tail = solution_str[-TAIL_CHARS:]
    if method == "strict":
        found = re.findall(r"#### (\-?[0-9\.\,]+)", tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method != "flexible":
        raise ValueError(f"method must be strict or flexible, got {method!r}")
    numbers = re.findall(r"(\-?[0-9\.\,]+)", tail)
    for answer in reversed(numbers):  # the last that is not "." (or, when all are, the first: verl's loop)
        if answer not in ("", "."):
            return answer
    return numbers[0] if numbers else None


# ----------------------------------------------------------------------------------- MATH (Hendrycks et al. 2021)

def math_score(solution_str: str, ground_truth: str) -> float:
    """verl's ``math_reward.compute_score``: 1.0 when the last boxed answer is MATH-equivalent to the ground truth."""
    try:
        boxed = last_boxed(solution_str, fbox=True)
        return 1.0 if boxed is not None and math_equivalent(unbox(boxed), ground_truth) else 0.0
    except (AssertionError, IndexError, ValueError):  # an ill-formed box scores 0, as verl's catch-all does
        return 0.0


def last_boxed(text: str, *, fbox: bool = False) -> str | None:
    """The last ``\\boxed{...}`` of ``text`` with balanced braces (MATH's: also ``\\boxed x`` up to a ``$``, and
    ``\\fbox{...}`` with ``fbox``); None when there is none or it never closes."""
    if fbox and "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed" if fbox else "\\boxed{")
    if start < 0 and fbox:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if text[index] == "}" and depth == 0:
            return text[start: index + 1]
    return None


def unbox(boxed: str, *, spaced: bool = True) -> str:
    """The contents of ``\\boxed{...}`` (or, ``spaced``, of MATH's ``\\boxed x``)."""
    if spaced and "\\boxed " in boxed:
        if not boxed.startswith("\\boxed "):
            raise ValueError(f"not a boxed answer: {boxed!r}")
        return boxed[len("\\boxed "):]
    if not (boxed.startswith("\\boxed{") and boxed.endswith("}")):
        raise ValueError(f"not a boxed answer: {boxed!r}")
    return boxed[len("\\boxed{"):-1]


def math_equivalent(first: str | None, second: str | None) -> bool:
    """MATH's ``is_equiv``: equal after ``math_normalize`` (as plain text when normalising fails)."""
    if first is None or second is None:
        return first is None and second is None
    try:
        return math_normalize(first) == math_normalize(second)
    except (AssertionError, IndexError, ValueError):
        return first == second


def math_normalize(text: str) -> str:
    """Hendrycks et al.'s ``strip_string``, rule by rule."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        text = text.replace(old, new)
    if "\\text{ " in text:  # units after the value
        parts = text.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit")
        text = parts[0]
    for old, new in (("\\\\%", ""), ("\\%", ""), (" .", " 0."), ("{.", "{0.")):
        text = text.replace(old, new)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 3" -> "3"
        text = sides[1]
    text = _sqrt_braces(text).replace(" ", "")
    text = _frac_braces(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def _sqrt_braces(text: str) -> str:
    """``\\sqrt2`` -> ``\\sqrt{2}`` (one character)."""
    head, *rest = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:]) for part in rest)


def _frac_braces(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}`` (the text unchanged when one is too short)."""
    head, *rest = text.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return text
        elif part[1] != "{":
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
        else:
            out += "{" + part[0] + "}" + part[1:]
    return out


def _slash_to_frac(text: str) -> str:
    """``3/4`` (two integers, nothing else) -> ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


# -------------------------------------------------------------------------------------- DAPO (Minerva's scorer)

SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
           "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
           "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
           "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots")
INVALID = "[INVALID]"


def dapo_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict[str, Any]:
    """verl's ``math_dapo.compute_score``: 1.0 / -1.0, its correctness and the prediction it read."""
    correct, pred = dapo_verify(solution_str[-TAIL_CHARS:], ground_truth, strict_box_verify)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def dapo_verify(solution_str: str, answer: str, strict_box_verify: bool = False) -> tuple[bool, str | None]:
    """Minerva's check of the last ``Answer:`` line; without one, the last box must equal the answer exactly."""
    if not strict_box_verify:
        found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", solution_str)
        pred = minerva_normalize(found[-1] if found else INVALID)
        if pred != INVALID:
            return pred == minerva_normalize(answer), pred
    boxed = last_boxed(solution_str[-100:])
    if boxed is None:
        return False, None if strict_box_verify else INVALID
    pred = unbox(boxed, spaced=False)
    return pred == answer, pred


def minerva_normalize(answer: str) -> str:
    """Minerva's ``normalize_final_answer`` (Lewkowycz et al. 2022, App. D) as DAPO's scorer applies it."""
    answer = answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for removed in REMOVED:
        answer = answer.replace(removed, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    for command in ("text", "textbf", "overline"):
        answer = re.sub(r"(\\" + command + r"\{)(.*?)(\})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()
