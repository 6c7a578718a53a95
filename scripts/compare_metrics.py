"""Are two runs' ``metrics.jsonl`` bit-identical (``time/*`` and ``perf/*`` ignored)?

    python scripts/compare_metrics.py RUN_DIR_A RUN_DIR_B [RUN_DIR_A2 RUN_DIR_B2 ...]

For each pair: same steps, same metric names, and every value equal as a float64 bit pattern
(NaN equals NaN). Metrics renamed on purpose since A was made are read under their new names
(``RENAMED``), and metrics new in B (``ADDED``) are left out. Prints one line per pair and exits 1 if any pair differs (listing the first
differences). A refactor that "changes no number" must pass this on its reference runs.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

IGNORED = ("time/", "perf/")
RENAMED = {"train/solved_groups_frac": "train/uniform_reward_groups_frac"}  # issue 19: says what it counts
ADDED = ("train/all_correct_groups_frac", "train/all_wrong_groups_frac")  # issue 19: the split of the above


def rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{RENAMED.get(k, k): v for k, v in json.loads(line).items() if not k.startswith(IGNORED) and k not in ADDED}
            for line in lines]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


def differences(a_dir: Path, b_dir: Path) -> list[str]:
    a, b = rows(a_dir), rows(b_dir)
    if len(a) != len(b):
        return [f"{len(a)} rows vs {len(b)}"]
    out = []
    for ra, rb in zip(a, b):
        step = ra.get("step")
        if set(ra) != set(rb):
            out.append(f"step {step}: keys only in A {sorted(set(ra) - set(rb))}, only in B {sorted(set(rb) - set(ra))}")
        out += [f"step {step}: {k} {ra[k]!r} != {rb[k]!r}" for k in sorted(set(ra) & set(rb)) if not same(ra[k], rb[k])]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for a, b in zip(argv[::2], argv[1::2]):
        diff = differences(Path(a), Path(b))
        n = len(rows(Path(a)))
        print(f"{'IDENTICAL' if not diff else 'DIFFERENT'}  {a}  vs  {b}  ({n} rows, {len(rows(Path(a))[-1])} metrics in the last)")
        for line in diff[:10]:
            print("    " + line)
        failed |= bool(diff)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
