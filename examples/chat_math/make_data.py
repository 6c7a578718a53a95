"""Write the example's data files (already in data/; run again to regenerate them, seed 0).

    data/train.jsonl  RL prompts: {"prompt": [chat], "answer": ..., "kind": "number" | "latex"}
    data/sft.jsonl    SFT rows:   {"messages": [user, assistant]} with worked answers in \\boxed{}
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def question(rng: random.Random) -> tuple[str, str, str]:
    """(question, answer, kind): a sum of two digits, or a fraction to write in LaTeX."""
    if rng.random() < 0.7:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} + {b}?", str(a + b), "number"
    numerator, denominator = rng.randint(1, 9), rng.randint(2, 9)
    return f"Write {numerator} over {denominator} as a fraction.", f"\\frac{{{numerator}}}{{{denominator}}}", "latex"


def main() -> None:
    rng = random.Random(0)
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    with open(data / "train.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            text, answer, kind = question(rng)
            row = {"prompt": [{"role": "user", "content": text}], "answer": answer, "kind": kind}
            f.write(json.dumps(row) + "\n")
    with open(data / "sft.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            text, answer, _ = question(rng)
            reply = f"The answer is \\boxed{{{answer}}}."
            f.write(json.dumps({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]}) + "\n")


if __name__ == "__main__":
    main()
