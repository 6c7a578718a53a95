"""The paper's experiments in miniature: arm tables and generated configs, a resumable sweep, analysis,
report and plots.

- ``arms``: arm tables (``experiments/**/arms.yaml``) and the generator of complete arm configs;
- ``sweep``: ``minirl sweep``, every arm x seed as a resumable ``minirl train`` subprocess;
- ``runs``: reading run directories (``config.yaml``, ``metrics.jsonl``);
- ``analysis``: pure statistics (collapse, falls, Welch / paired t, Holm);
- ``claims``: the paper's claims as typed checks; ``report``: ``minirl report``; ``plots``: ``minirl plot``;
- ``studies``: the pre-registered studies' decision rules;
- ``python -m minirl.experiments``: ``generate`` / ``check`` the arm files, ``contrast`` two arms' metric.
"""

from __future__ import annotations

from minirl.experiments.arms import find_arms, generate, load_arm
from minirl.experiments.runs import load_runs

__all__ = ["find_arms", "generate", "load_arm", "load_runs"]
