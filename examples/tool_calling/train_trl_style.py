"""The same RL run from Python, in the shape of TRL's tool-calling GRPO (``GRPOTrainer(model, reward_funcs,
train_dataset, tools=[...]).train()``), after the model and the SFT of the README's commands::

    python build_model.py model
    minirl sft config.yaml --output runs/tool_calling/sft
    python train_trl_style.py [key=value ...]     # e.g. optim.global_steps=10

``config.yaml`` plays the part of TRL's ``args``; the dataset, the tools and the reward functions are Python objects.
"""

import sys

from datasets import load_dataset

import minirl
from calculator import add, multiply
from rewards import correct, used_a_tool

dataset = load_dataset("json", data_files="data/train.jsonl", split="train")

summary = minirl.train(
    "config.yaml", "run.name=tool_calling_trl_style", *sys.argv[1:],
    start_from="runs/tool_calling/sft",
    train_dataset=dataset,
    tools=[add, multiply],
    reward_funcs=[correct, used_a_tool],
)
print(f"held-out accuracy {summary.eval_before:.3f} -> {summary.eval_after:.3f} ({summary.run_dir})")
