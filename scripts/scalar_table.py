#!/usr/bin/env python
"""Print logged scalars of several runs side by side, as a Markdown table.

The ablation bench's instruments (`instruments/grad_norm/...`, `instruments/activations/...`)
live in each run's TensorBoard events; this reads them back for the documentation: one row
per tag and run, one column per update asked for (the nearest logged update at or before it).

    python scripts/scalar_table.py ablations/runs/deep_pre ablations/runs/deep_post \\
        --tags 'instruments/grad_norm/decoder.?' --steps 10,100,600
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.evaluate.curves import read_scalars, scalar_tags


def value_at(curve, step: int):
    """The last logged value at or before `step`, with the update it was logged at."""
    before = [(s, v) for s, v in curve if s <= step]
    return before[-1] if before else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories")
    parser.add_argument("--tags", required=True, help="comma-separated tag patterns (fnmatch: * and ?)")
    parser.add_argument("--steps", required=True, help="comma-separated update numbers")
    parser.add_argument("--digits", type=int, default=3)
    args = parser.parse_args()

    patterns = [p.strip() for p in args.tags.split(",") if p.strip()]
    steps = [int(s) for s in args.steps.split(",")]
    runs = [Path(run) for run in args.runs]
    for run in runs:
        if not run.is_dir():
            sys.exit(f"scalar_table: {run}: no such run directory")
    tags = sorted(
        {tag for run in runs for tag in scalar_tags(run) if any(fnmatch.fnmatchcase(tag, p) for p in patterns)}
    )
    if not tags:
        sys.exit(f"scalar_table: no tag matches {args.tags!r} in {', '.join(args.runs)}")
    curves = {run: read_scalars(run, tags) for run in runs}  # each run's events read once

    print("| tag | run | " + " | ".join(f"update {s}" for s in steps) + " |")
    print("|---|---|" + "---|" * len(steps))
    for tag in tags:
        for run in runs:
            cells = []
            for step in steps:
                hit = value_at(curves[run][tag], step)
                cells.append(
                    "-" if hit is None else f"{hit[1]:.{args.digits}g}" + ("" if hit[0] == step else f" (@{hit[0]})")
                )
            print(f"| {tag.removeprefix('instruments/')} | {run.name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
