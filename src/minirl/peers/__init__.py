"""A TRL, verl, slime or OpenRLHF run's settings as a minirl config: ``minirl config from-trl`` / ``from-verl`` /
``from-slime`` / ``from-openrlhf``, ``minirl.train(args=...)``.

* **TRL**: the YAML file of ``trl grpo --config FILE`` (``GRPOConfig`` + ``ModelConfig`` + the
  script's ``model_name_or_path`` / ``dataset_name`` / ``reward_funcs``), read against TRL 1.16's
  defaults (``grpo_config.py``; transformers' ``TrainingArguments`` for the rest).
* **verl**: the Hydra overrides of a run script (``python3 -m verl.trainer.main_ppo key=value ...``,
  with the script's own ``NAME=value`` variables expanded), a YAML config, or ``key=value`` words,
  read against verl 0.9's ``ppo_trainer.yaml`` defaults.

A key the peer's run did not set takes the peer's default, so the translation describes the run
the user had. Every peer key ends in one of four places, all written into the output's header:
translated (with its origin beside the minirl key), translated but **differs** (what changes, in one
line), **not translated** (no minirl equivalent; the value is named) or ignored (no effect on what is
trained here: ports, logging cadence, hub uploads, ...).

The objective is carried over when minirl has the same loss (TRL ``loss_type`` grpo / dr_grpo / dapo,
verl ``loss_agg_mode`` on the vanilla PPO loss or GSPO, GRPO advantages, token-level truncated IS; the
gradient is checked against the peers' formulas in ``tests/unit/test_peers.py``, and the few places it can
differ, such as verl's dual clip, are listed). Otherwise — or with ``keep_objective`` — no ``algo.*`` key is written and the run trains with
minirl's MiniRL (paper Eq. 7); the header says which peer keys that drops. The mapping of each key is
the table of ``docs/coming_from_trl_verl.md``.

* **slime**: the ``--flag value`` words of a launch script's ``python3 train.py`` command (its bash arrays and
  variables expanded), a ``--custom-config-path`` YAML or flags given directly, read against slime's defaults
  (``arguments.py``) and Megatron-LM's for its optimizer flags.

* **prime-rl**: the TOML file of its ``rl`` entry point (``[model]``, ``[trainer]``, ``[orchestrator]``, ...), read
  against its defaults; its verifiers environment becomes ``task.path: verifiers:ID`` and the
  ``minirl.tasks.verifiers_env:rubric`` reward (``minirl.peers.prime_rl``).

* **OpenRLHF**: the ``--flag value`` words of a launch script's ``python3 -m openrlhf.cli.train_ppo_ray`` command
  (read as slime's are) or flags given directly, underscore (0.8 / 0.9) or dotted (the newest release), read against
  OpenRLHF's defaults; its ``--remote_rm_url reward_func.py`` runs unchanged (``convention: openrlhf``).

``minirl.peers.common`` holds the translation and its rendering, ``minirl.peers.shell`` the shell-script readers,
``minirl.peers.trl``, ``minirl.peers.verl`` and ``minirl.peers.slime`` each peer's defaults and mapping (and how its
files are read).
"""

from minirl.peers.common import Translation
from minirl.peers.launcher import read_accelerate
from minirl.peers.openrlhf import from_openrlhf, read_openrlhf
from minirl.peers.prime_rl import from_prime_rl, read_prime_rl
from minirl.peers.slime import from_slime, read_slime
from minirl.peers.trl import add_trl_sft, from_trl, read_trl
from minirl.peers.verl import from_verl, read_verl, script_overrides
from minirl.peers.verl_sft import add_verl_sft

__all__ = [
           "Translation",
           "add_trl_sft",
           "add_verl_sft",
           "from_openrlhf",
           "from_prime_rl",
           "from_slime",
           "from_trl",
           "from_verl",
           "read_accelerate",
           "read_openrlhf",
           "read_prime_rl",
           "read_slime",
           "read_trl",
           "read_verl",
           "script_overrides",
]
