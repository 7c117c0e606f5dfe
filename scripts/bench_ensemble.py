"""Ensembles against the best single model: test BLEU and decoding speed, one `mtrain eval` each.

    python scripts/bench_ensemble.py runs/a runs/b                 # run a's checkpoints, and a + b
    python scripts/bench_ensemble.py runs/a runs/b -- precision=fp32 decode.beam=4

Rows, each decoded by `mtrain eval run=... split=test out=DIR` (beam 5 unless overridden) with
the decode weights the runs choose (EMA when they kept it):
  - every run's best.pt alone;
  - run a's last 2 and last 3 kept checkpoints (update_N.pt, newest first) as an ensemble;
  - every run's best.pt together (independently seeded runs).
Printed: BLEU, chrF, sentences/s (the eval report's decoding time, without start-up) and the
speed relative to run a's best.pt alone. Reports are left in --out (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def kept_checkpoints(run: Path) -> list[Path]:
    """The run's update_N.pt checkpoints, newest first."""
    found = [
        (int(m.group(1)), path)
        for path in (run / "checkpoints").glob("update_*.pt")
        if (m := re.fullmatch(r"update_(\d+)\.pt", path.name))
    ]
    return [path for _, path in sorted(found, reverse=True)]


def evaluate(name: str, run: Path, checkpoint: str, members: list[str], out: Path, extra: list[str]) -> dict:
    """One `mtrain eval` of run's `checkpoint` with `members` as the rest of the ensemble."""
    report_dir = out / name
    command = [
        sys.executable,
        "-m",
        "mtrain.cli.evaluate",
        f"run={run}",
        "split=test",
        f"checkpoint={checkpoint}",
        f"out={report_dir}",
        *extra,
    ]
    if members:
        command.append("ensemble=[" + ",".join(members) + "]")
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{name}: mtrain eval failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads((report_dir / "test.json").read_text(encoding="utf-8"))


def rows(runs: list[Path]) -> list[tuple[str, Path, str, list[str]]]:
    """(name, run, checkpoint, other members) of every row, as the module docstring lists them."""
    first = runs[0]
    table = [(f"{run.name} best", run, "best", []) for run in runs]
    kept = kept_checkpoints(first)
    for count in (2, 3):
        if len(kept) >= count:
            table.append((f"{first.name} last {count} ckpts", first, str(kept[0]), [str(p) for p in kept[1:count]]))
    if len(runs) > 1:
        table.append(
            (
                " + ".join(f"{run.name} best" for run in runs),
                first,
                "best",
                [str(run / "checkpoints" / "best.pt") for run in runs[1:]],
            )
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "runs", nargs="+", type=Path, help="run directories of `mtrain fit` (the first one's checkpoints are ensembled)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where the eval reports go (default: a temporary folder)"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    # after --: more keys for every `mtrain eval` (precision=fp32 ...)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_ensemble_"))
    print(f"{'models':42s} {'BLEU':>6s} {'chrF':>6s} {'sent/s':>7s} {'speed':>6s}  members")
    baseline = None
    for name, run, checkpoint, members in rows(args.runs):
        report = evaluate(re.sub(r"[^A-Za-z0-9_.-]+", "_", name), run, checkpoint, members, out, extra)
        speed = report["sentences_per_s"]
        baseline = baseline or speed
        metrics = report["metrics"]
        print(
            f"{name:42s} {metrics['bleu']['score']:6.2f} {metrics['chrf']['score']:6.2f} {speed:7.1f} "
            f"{speed / baseline:5.2f}x  {1 + len(members)}",
            flush=True,
        )
    print(f"reports: {out}")


if __name__ == "__main__":
    main()
