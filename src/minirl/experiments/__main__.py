"""``python -m minirl.experiments``: generate or check the arm files; contrast two arms' metric; a study's verdicts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minirl.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    from minirl.experiments.analysis import level_contrast
    from minirl.experiments.arms import generate
    from minirl.experiments.runs import flat, load_runs
    from minirl.experiments.studies import STUDIES, StudyIncomplete, study_section

    parser = argparse.ArgumentParser(prog="python -m minirl.experiments", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    for name, text in (("generate", "write every arm file of every arm table under DIR"),
                       ("check", "exit 1 if an arm file under DIR differs from what the generator writes")):
        p = sub.add_parser(name, help=text)
        p.add_argument("dir", nargs="?", default="experiments", help="experiment directory (default: experiments)")
    p = sub.add_parser("contrast", help="two arms' per-seed level of a metric: means, paired and Welch tests")
    p.add_argument("runs_dir")
    p.add_argument("arm_a")
    p.add_argument("arm_b")
    p.add_argument("--key", default="mismatch/kl_k3")
    p.add_argument("--last", type=float, default=None, help="only the last fraction of logged steps, e.g. 0.25")
    p = sub.add_parser("verdicts", help="a pre-registered study's comparisons and verdicts from its runs")
    p.add_argument("runs_dir")
    p.add_argument("study", choices=sorted(STUDIES))
    p.add_argument("--interim", action="store_true",
                   help="before every registered run has finished: print the numbers so far, marked interim")
    args = parser.parse_args(argv)
    try:
        if args.action == "verdicts":
            print("\n".join(study_section(flat(load_runs(Path(args.runs_dir))), args.study, interim=args.interim)))
            return 0
        if args.action == "contrast":
            arms = flat(load_runs(Path(args.runs_dir)))
            print("\n".join(level_contrast(arms, args.arm_a, args.arm_b, args.key, args.last)))
            return 0
        changed = generate(Path(args.dir), check=args.action == "check")
    except ConfigError as exc:
        print(f"minirl: {exc}", file=sys.stderr)
        return 2
    except StudyIncomplete as exc:
        print(f"minirl: {exc}", file=sys.stderr)
        return 1
    if args.action == "check":
        print("up to date" if not changed else f"out of date: {', '.join(changed)}")
        return 1 if changed else 0
    print(f"wrote {len(changed)} arm file(s)" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
