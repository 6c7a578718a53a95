"""The studies' committed cold starts stay findable: every registered arm and seed still computes the key of
the SFT checkpoint committed under ``results/studies/<study>/_sft_cache`` (a new config key must keep the old
key at its default, or a later session would make a different cold start mid-study)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minirl.experiments.arms import load_arm
from minirl.sft import sft_cache_key

ROOT = Path(__file__).resolve().parents[2]
STUDIES = {"study1": "study1_replay", "study2": "study2_is"}


@pytest.mark.parametrize("results, experiment", STUDIES.items())
def test_every_arm_and_seed_finds_the_committed_cold_start(results, experiment):
    committed = sorted(p.name for p in (ROOT / "results" / "studies" / results / "_sft_cache").iterdir() if p.is_dir())
    assert len(committed) == 1
    arms = sorted((ROOT / "experiments" / "studies" / experiment).glob("*.yaml"))
    arms = [arm for arm in arms if arm.name != "arms.yaml"]
    assert len(arms) >= 2
    for arm in arms:
        for seed in range(6):  # the sweep's overrides that the key reads
            assert sft_cache_key(load_arm(arm, [f"run.seed={seed}", "run.threads=1"])) == committed[0], (arm.name, seed)


def test_new_task_keys_change_the_key_only_when_set():
    from minirl.config import load_config

    base = load_config(None, [])
    assert sft_cache_key(load_config(None, ["task.chat_template_kwargs={enable_thinking: false}"])) != sft_cache_key(base)
    # the cold start runs the trainer's forward: shared prompts change its gradients' rounding, so its cache
    assert sft_cache_key(load_config(None, ["optim.shared_prompt=true"])) != sft_cache_key(base)
    # a reward function's entry hashes as before reward models, keys and conventions existed (none of them in it)
    from minirl.sft import _without_new_defaults

    entry = _without_new_defaults(load_config(None, ["task.reward_functions=[{function: 'a:b'}]"]).task)["reward_functions"][0]
    assert sorted(entry) == ["batched", "function", "kwargs", "name", "weight"]
