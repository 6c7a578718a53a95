"""``minirl.tasks.verl_scores`` against verl's own scorers on generated strings (a parity check, not a test: verl is
not a dependency). Unpack a verl wheel (``pip download verl==0.9.1 --no-deps``, then unzip it) and give the path of
its ``verl/utils/reward_score`` directory:

    python scripts/compare_verl_scores.py /tmp/peers/verl/verl/utils/reward_score

Prints how many strings each scorer agreed on and the first differences (2026-12-05, verl 0.9.1: none of 200,000
random strings, none of 150,000 built around a box, an ``Answer:`` line or ``####``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import random
import sys
from typing import Any

from minirl.tasks import verl_scores as ours

ATOMS = ["\\boxed{", "\\boxed ", "\\fbox{", "}", "{", "\\frac", "\\dfrac", "\\tfrac", "12", "3", "1/2", "0.5", ".5", "x=",
         "x = ", "\\sqrt", "2", "\\text{ cm}", "\\text{and}", "\\%", "%", "$", "\\$", " ", "\n", "#### ", "-7", "1,234", ".",
         ",", "Answer:", "answer: ", "The answer is ", "\\left(", "\\right)", "^\\circ", "^{\\circ}", "degrees", "a ", "an ",
         "\\!", "\\\\", "mbox", "\\text{m}", "\\overline{", "\\textbf{", "ways", "\\ldots", "=", "sqrt", "frac", "7", "10"]
VALUES = ["\\frac{1}{2}", "0.5", "1/2", "\\dfrac12", "x = 3", "3", "3\\text{ cm}", "10\\%", "\\sqrt2", "\\sqrt{2}", "1,234",
          "1234", ".5", "-7"]


def load(root: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, f"{root}/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcome(function: Any, *args: Any) -> Any:
    """The function's value (a number as a float), or the exception it raised."""
    try:
        value = function(*args)
    except Exception as error:  # both sides must raise alike
        return ("raise", type(error).__name__)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def pairs(verl: dict[str, Any], solution: str, truth: str) -> list[tuple[str, Any, Any]]:
    g, m, d = verl["gsm8k"], verl["math_reward"], verl["math_dapo"]
    with contextlib.redirect_stdout(io.StringIO()):  # verl prints on failures
        return [("gsm8k", outcome(g.compute_score, solution, truth), outcome(ours.gsm8k_score, solution, truth)),
                ("gsm8k_flexible", outcome(g.extract_solution, solution, "flexible"),
                 outcome(ours.gsm8k_answer, solution, "flexible")),
                ("math", outcome(m.compute_score, solution, truth), outcome(ours.math_score, solution, truth)),
                ("math_equiv", outcome(m.is_equiv, solution, truth), outcome(ours.math_equivalent, solution, truth)),
                ("dapo", outcome(d.compute_score, solution, truth), outcome(ours.dapo_score, solution, truth)),
                ("dapo_strict", outcome(d.verify, solution, truth, True), outcome(ours.dapo_verify, solution, truth, True))]


def main() -> None:
    verl = {name: load(sys.argv[1], name) for name in ("gsm8k", "math_reward", "math_dapo")}
    rng = random.Random(0)

    def text() -> str:
        return "".join(rng.choice(ATOMS) for _ in range(rng.randint(0, 14)))

    agreed: dict[str, int] = {}
    differ = []
    cases = [(text(), text()) for _ in range(200_000)]
    for _ in range(50_000):  # answers that can be right: a box, an Answer: line, a gsm8k mark
        value, truth = rng.choice(VALUES), rng.choice(VALUES)
        cases += [(text() + "\\boxed{" + value + "}" + rng.choice(["", " ", "."]), truth),
                  (text() + "Answer: " + value, truth), (text() + "#### " + value, truth)]
    for solution, truth in cases:
        for name, theirs, mine in pairs(verl, solution, truth):
            if theirs == mine:
                agreed[name] = agreed.get(name, 0) + 1
            else:
                differ.append((name, solution, truth, theirs, mine))
    print(f"{len(cases)} cases; agreed: {agreed}; differences: {len(differ)}")
    for case in differ[:10]:
        print(repr(case))


if __name__ == "__main__":
    main()
