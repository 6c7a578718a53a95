"""Write the example's data files (run again to regenerate them, seed 0).

    data/train.jsonl  RL prompts: {"prompt": [chat], "answer": ...}: a product of two two-digit numbers
    data/sft.jsonl    SFT rows:   {"messages": [user, assistant with tool_calls, tool, assistant]}: the
                      model calls ``multiply`` and states its result (TRL's tool-calling conversation rows)
    data/train_verl.jsonl  the RL prompts in verl's layout, for verl's tools (``tool_config.yaml``): each row's
                      ``extra_info.tools_kwargs`` hands the tools its answer at ``create``
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def question(rng: random.Random) -> tuple[str, int, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a} * {b}?", a, b


def main() -> None:
    rng = random.Random(0)
    data = HERE / "data"
    data.mkdir(exist_ok=True)
    with open(data / "train.jsonl", "w", encoding="utf-8") as f, open(data / "train_verl.jsonl", "w", encoding="utf-8") as v:
        for index in range(300):
            text, a, b = question(rng)
            f.write(json.dumps({"prompt": [{"role": "user", "content": text}], "answer": str(a * b)}) + "\n")
            created = {"create_kwargs": {"ground_truth": str(a * b)}}
            v.write(json.dumps({"data_source": "calculator", "prompt": [{"role": "user", "content": text}],
                                "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                                "extra_info": {"index": index, "tools_kwargs": {"add": created, "multiply": created}}})
                    + "\n")
    with open(data / "sft.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            text, a, b = question(rng)
            call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
            messages = [{"role": "user", "content": text},
                        {"role": "assistant", "content": "", "tool_calls": [call]},
                        {"role": "tool", "name": "multiply", "content": str(a * b)},
                        {"role": "assistant", "content": f"The answer is {a * b}."}]
            f.write(json.dumps({"messages": messages}) + "\n")


if __name__ == "__main__":
    main()
