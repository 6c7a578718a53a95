"""The same RL run from Python, in the shape of TRL's quickstart (``GRPOTrainer(model, reward_funcs,
train_dataset).train()``), after the model and the SFT of the README's first two commands::

    python build_model.py model
    minirl sft config.yaml --output runs/chat_math/sft
    python train_trl_style.py [key=value ...]     # e.g. optim.global_steps=10

``config.yaml`` plays the part of TRL's ``args``; the dataset and the reward functions are Python objects here.
"""

import sys

from datasets import load_dataset

import minirl
from rewards import boxed_format, correct

dataset = load_dataset("json", data_files="data/train.jsonl", split="train")

summary = minirl.train(
    "config.yaml", "run.name=chat_math_trl_style", *sys.argv[1:],
    start_from="runs/chat_math/sft",
    train_dataset=dataset,
    reward_funcs=[correct, boxed_format],
    reward_weights=[1.0, 0.2],
)
print(f"held-out accuracy {summary.eval_before:.3f} -> {summary.eval_after:.3f} ({summary.run_dir})")
