"""Synthetic tasks with exact verifiers and teachers that write worked solutions.

Three families, each generated from a seed, with a ``difficulty`` knob that sets the input length:

    family    prompt text           answer     difficulty            default
    reverse   "rev cbdae\\n"         "eadbc"    letters in the word   8
    add       "add 482+397\\n"       "879"      digits per operand    3
    sort      "sort 3141592\\n"      "1123459"  digits to sort        8

Answer format (all families, all teacher styles): a completion ends with a final line
``#### <answer>``. The extracted answer is everything after the **last** ``####`` with surrounding
whitespace stripped, so trailing text after the answer makes it wrong. No ``####`` means no
answer (reward 0). Reward is 1.0 when the extracted answer equals ``prompt.answer`` exactly.

Teacher styles (the paper's cold start distils from three different teachers; here three formats
of reasoning before the same answer line). For reverse "cbdae":

    direct    "#### eadbc"
    stepwise  "5e 4a 3d 2b 1c\\n#### eadbc"                 letters last to first, with positions
    verbose   "in cbdae\\nsplit cbd|ae\\nflip ea|dbc\\n#### eadbc"   chunks of 3, flipped
    trace     "cbda | e\\ncbd | ea\\ncb | ead\\nc | eadb\\n | eadbc\\n#### eadbc"
                                                          one letter moved per line, the whole
                                                          state rewritten: ~difficulty^2 tokens
                                                          (~210 at difficulty 12), the long
                                                          worked solution of the stress study

Solutions grow linearly with ``difficulty``. Train and eval prompts are distinct inputs (asserted);
the eval split depends only on (seed, difficulty, num_eval), so changing ``num_train`` leaves it
unchanged.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from typing import ClassVar

from minirl.types import Prompt

ANSWER_MARKER = "####"
STYLES: tuple[str, ...] = ("direct", "stepwise", "verbose", "trace")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_DIGITS = "0123456789"
_ENUMERATE_BELOW = 200_000  # spaces smaller than this are enumerated rather than rejection-sampled


def extract_answer(completion: str) -> str | None:
    """Text after the last ``####``, whitespace-stripped; ``None`` when there is no marker."""
    if ANSWER_MARKER not in completion:
        return None
    return completion.rsplit(ANSWER_MARKER, 1)[1].strip()


def _answer_line(answer: str) -> str:
    return f"{ANSWER_MARKER} {answer}"


class SyntheticTask(ABC):
    """Shared machinery: distinct instances from a seed, disjoint splits, exact-match reward.

    A subclass defines how an input is drawn (``_draw_input``), how many inputs exist
    (``_input_space_size``), the prompt text, the answer, and one writer per teacher style.
    """

    family: ClassVar[str]
    prompt_prefix: ClassVar[str]
    default_difficulty: ClassVar[int]
    styles: tuple[str, ...] = STYLES

    def __init__(
        self, difficulty: int | None = None, num_train: int = 2000, num_eval: int = 200, seed: int = 0
    ) -> None:
        self.difficulty = self.default_difficulty if difficulty is None else int(difficulty)
        if self.difficulty < 1:
            raise ValueError(f"{self.family}: difficulty must be >= 1, got {self.difficulty}")
        if num_train < 1 or num_eval < 0:
            raise ValueError(f"{self.family}: need num_train >= 1 and num_eval >= 0, got {num_train}, {num_eval}")
        space = self._input_space_size()
        if num_train + num_eval > space:
            raise ValueError(
                f"{self.family} at difficulty {self.difficulty} has only {space} distinct inputs; "
                f"asked for num_train + num_eval = {num_train + num_eval}"
            )
        self.name = self.family
        self.num_train, self.num_eval, self.seed = num_train, num_eval, seed
        eval_inputs = self._distinct_inputs(num_eval, exclude=set(), stream="eval")
        train_inputs = self._distinct_inputs(num_train, exclude=set(eval_inputs), stream="train")
        assert not set(train_inputs) & set(eval_inputs), "train and eval inputs overlap"
        self._train = [self._make_prompt(item, "train", index) for index, item in enumerate(train_inputs)]
        self._eval = [self._make_prompt(item, "eval", index) for index, item in enumerate(eval_inputs)]

    # --- the Task protocol ----------------------------------------------------------------------

    def train_prompts(self) -> list[Prompt]:
        return list(self._train)

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if extract_answer(completion) == prompt.answer else 0.0

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def teacher_solution(self, prompt: Prompt, style: str) -> str:
        """A correct completion in ``style`` (reasoning, then ``#### answer``), without EOS."""
        if style not in self.styles:
            raise ValueError(f"unknown teacher style {style!r} for {self.family}; styles: {', '.join(self.styles)}")
        item = self.parse_input(prompt.text)
        reasoning = getattr(self, f"_reason_{style}")(item)
        solution = (reasoning + "\n" if reasoning else "") + _answer_line(self._answer(item))
        return solution

    # --- prompts ---------------------------------------------------------------------------------

    def prompt_text(self, item: str) -> str:
        return f"{self.prompt_prefix} {item}\n"

    def parse_input(self, prompt_text: str) -> str:
        """The input string of a prompt of this family; ``ValueError`` for any other text."""
        match = re.fullmatch(rf"{self.prompt_prefix} (\S+)\n", prompt_text)
        if match is None:
            raise ValueError(f"not a {self.family} prompt: {prompt_text!r}")
        return match.group(1)

    def _make_prompt(self, item: str, split: str, index: int) -> Prompt:
        return Prompt(
            text=self.prompt_text(item),
            answer=self._answer(item),
            uid=f"{self.family}-{split}-{index}",
            meta={"family": self.family, "difficulty": self.difficulty, "split": split, "input": item},
        )

    def _distinct_inputs(self, count: int, exclude: set[str], stream: str) -> list[str]:
        rng = random.Random(f"minirl/{self.family}/{self.difficulty}/{self.seed}/{stream}")
        if self._input_space_size() < _ENUMERATE_BELOW:
            candidates = [item for item in self._all_inputs() if item not in exclude]
            return rng.sample(candidates, count)
        chosen: dict[str, None] = {}  # insertion-ordered set
        while len(chosen) < count:
            item = self._draw_input(rng)
            if item not in exclude:
                chosen[item] = None
        return list(chosen)

    # --- per family ------------------------------------------------------------------------------

    @abstractmethod
    def _input_space_size(self) -> int: ...

    @abstractmethod
    def _all_inputs(self) -> list[str]: ...

    @abstractmethod
    def _draw_input(self, rng: random.Random) -> str: ...

    @abstractmethod
    def _answer(self, item: str) -> str: ...

    @abstractmethod
    def _reason_direct(self, item: str) -> str: ...

    @abstractmethod
    def _reason_stepwise(self, item: str) -> str: ...

    @abstractmethod
    def _reason_verbose(self, item: str) -> str: ...

    @abstractmethod
    def _reason_trace(self, item: str) -> str: ...


def _strings_over(alphabet: str, length: int) -> list[str]:
    items = [""]
    for _ in range(length):
        items = [prefix + symbol for prefix in items for symbol in alphabet]
    return items


class ReverseTask(SyntheticTask):
    """Reverse a word of random lowercase letters; ``difficulty`` letters."""

    family = "reverse"
    prompt_prefix = "rev"
    default_difficulty = 8

    def _input_space_size(self) -> int:
        return len(_LETTERS) ** self.difficulty

    def _all_inputs(self) -> list[str]:
        return _strings_over(_LETTERS, self.difficulty)

    def _draw_input(self, rng: random.Random) -> str:
        return "".join(rng.choice(_LETTERS) for _ in range(self.difficulty))

    def parse_input(self, prompt_text: str) -> str:
        word = super().parse_input(prompt_text)
        if not word.isalpha():
            raise ValueError(f"not a reverse prompt: {prompt_text!r}")
        return word

    def _answer(self, item: str) -> str:
        return item[::-1]

    def _reason_direct(self, item: str) -> str:
        return ""

    def _reason_stepwise(self, item: str) -> str:
        # Positions are 1-based, read from the last letter to the first: "5e 4a 3d 2b 1c".
        return " ".join(f"{position}{item[position - 1]}" for position in range(len(item), 0, -1))

    def _reason_verbose(self, item: str) -> str:
        chunks = [item[start : start + 3] for start in range(0, len(item), 3)]
        flipped = [chunk[::-1] for chunk in reversed(chunks)]
        return f"in {item}\nsplit {'|'.join(chunks)}\nflip {'|'.join(flipped)}"

    def _reason_trace(self, item: str) -> str:
        # Move the last letter of the rest to the end of the output, one line per letter.
        return "\n".join(f"{item[:rest]} | {item[rest:][::-1]}" for rest in range(len(item) - 1, -1, -1))


class AddTask(SyntheticTask):
    """Add two non-negative integers of exactly ``difficulty`` digits each (no leading zeros)."""

    family = "add"
    prompt_prefix = "add"
    default_difficulty = 3

    def _operand_count(self) -> int:
        return 10 if self.difficulty == 1 else 9 * 10 ** (self.difficulty - 1)

    def _input_space_size(self) -> int:
        return self._operand_count() ** 2

    def _all_inputs(self) -> list[str]:
        low = 0 if self.difficulty == 1 else 10 ** (self.difficulty - 1)
        operands = range(low, 10**self.difficulty)
        return [f"{left}+{right}" for left in operands for right in operands]

    def _draw_input(self, rng: random.Random) -> str:
        low = 0 if self.difficulty == 1 else 10 ** (self.difficulty - 1)
        high = 10**self.difficulty - 1
        return f"{rng.randint(low, high)}+{rng.randint(low, high)}"

    def parse_input(self, prompt_text: str) -> str:
        item = super().parse_input(prompt_text)
        if re.fullmatch(r"\d+\+\d+", item) is None:
            raise ValueError(f"not an add prompt: {prompt_text!r}")
        return item

    def _operands(self, item: str) -> tuple[str, str]:
        left, right = item.split("+")
        return left, right

    def _answer(self, item: str) -> str:
        left, right = self._operands(item)
        return str(int(left) + int(right))

    def _reason_direct(self, item: str) -> str:
        return ""

    def _column_sums(self, item: str, width: int) -> str:
        """Right to left in chunks of ``width`` digits: one line "x+y+carry=sum" per chunk."""
        left, right = self._operands(item)
        digits = max(len(left), len(right))
        digits += -digits % width
        left, right = left.zfill(digits), right.zfill(digits)
        lines, carry = [], 0
        for end in range(digits, 0, -width):
            x, y = left[end - width : end], right[end - width : end]
            total = int(x) + int(y) + carry
            lines.append(f"{x}+{y}+{carry}={total}")
            carry = total // 10**width
        return "\n".join(lines)

    def _reason_stepwise(self, item: str) -> str:
        # Digit by digit from the units, with the carry in: "2+7+0=9\n8+9+0=17\n4+3+1=8".
        return self._column_sums(item, width=1)

    def _reason_verbose(self, item: str) -> str:
        # Restate, then two-digit chunks from the right: "482+397\n82+97+0=179\n04+03+1=8".
        return f"in {item}\n" + self._column_sums(item, width=2)

    def _reason_trace(self, item: str) -> str:
        # The digit-by-digit sums, each followed by the answer digits so far: "2+7+0=9 9\n8+9+0=17 79\n...".
        lines, digits = [], ""
        for line in self._column_sums(item, width=1).split("\n"):
            digits = line.rsplit("=", 1)[1][-1] + digits
            lines.append(f"{line} {digits}")
        return "\n".join(lines)


class SortTask(SyntheticTask):
    """Sort a string of ``difficulty`` random digits in ascending order."""

    family = "sort"
    prompt_prefix = "sort"
    default_difficulty = 8

    def _input_space_size(self) -> int:
        return 10**self.difficulty

    def _all_inputs(self) -> list[str]:
        return _strings_over(_DIGITS, self.difficulty)

    def _draw_input(self, rng: random.Random) -> str:
        return "".join(rng.choice(_DIGITS) for _ in range(self.difficulty))

    def parse_input(self, prompt_text: str) -> str:
        item = super().parse_input(prompt_text)
        if not item.isdigit():
            raise ValueError(f"not a sort prompt: {prompt_text!r}")
        return item

    def _answer(self, item: str) -> str:
        return "".join(sorted(item))

    def _reason_direct(self, item: str) -> str:
        return ""

    def _reason_stepwise(self, item: str) -> str:
        # Count each digit present, in order: "1x2 2x1 3x1 4x1 5x1 9x1".
        return " ".join(f"{digit}x{item.count(digit)}" for digit in _DIGITS if digit in item)

    def _reason_verbose(self, item: str) -> str:
        # Restate, then sort the low (0-4) and high (5-9) digits apart: "in 3141592\nlo 11234\nhi 59".
        low = "".join(sorted(digit for digit in item if digit < "5"))
        high = "".join(sorted(digit for digit in item if digit >= "5"))
        return f"in {item}\nlo {low or '-'}\nhi {high or '-'}"

    def _reason_trace(self, item: str) -> str:
        # Selection sort: take the smallest digit left, one line per digit: "314159 | 1\n34159 | 11\n...".
        rest, done, lines = item, "", []
        while rest:
            smallest = min(rest)
            rest = rest.replace(smallest, "", 1)
            done += smallest
            lines.append(f"{rest} | {done}")
        return "\n".join(lines)


SYNTHETIC_TASKS: dict[str, type[SyntheticTask]] = {
    "reverse": ReverseTask,
    "add": AddTask,
    "sort": SortTask,
}
