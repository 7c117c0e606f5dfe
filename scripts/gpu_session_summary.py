#!/usr/bin/env python
"""The GPU session's answers in one table: per step, how it ended, its seconds and its answer.

Reads what scripts/gpu_session.sh left in OUT (steps.tsv: one line per step, name, outcome,
seconds; each step's JSON), prints a Markdown table and writes OUT/steps.json. A step that
ran but left no figures says so ("no result"), so a rehearsal or a session shows at a glance
which questions are still open.

    python scripts/gpu_session_summary.py OUT
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def gpu_check_answer(out: Path) -> str | None:
    report = read_json(out / "gpu.json")
    if report is None:
        return None
    parts = []
    tracking = report.get("tracking")
    if tracking:
        verdict = "PASS" if tracking["passed"] else "FAIL"
        parts.append(f"bf16 tracks fp32: {verdict} (gap {100 * tracking['relative_gap']:.2f}%)")
    for run in report.get("runs", []):
        if run.get("skipped"):
            parts.append(f"{run['model']} {run['mode']}: {run['skipped']}")
            continue
        mfu = "" if run.get("mfu") is None else f", MFU {100 * run['mfu']:.1f}%"
        parts.append(f"{run['model']} {run['mode']} {run['tgt_tokens_per_s']:,.0f} tgt tok/s{mfu}")
        profile = run.get("profile")
        if profile:
            busy = profile.get("device_busy_share")
            parts.append("device busy " + ("n/a (CPU)" if busy is None else f"{100 * busy:.0f}%"))
            calls = profile.get("sdpa", {}).get("calls_per_update", {})
            parts.append("sdpa " + ("/".join(sorted(calls)) if calls else "none (math)"))
            parts.append(f"top kernel {profile['top'][0]['name'][:40]}" if profile.get("top") else "no kernels")
    return "; ".join(parts) or None


def compile_answer(out: Path) -> str | None:
    report = read_json(out / "compile.json")
    if report is None or not report.get("rows"):
        return None
    parts = []
    for row in report["rows"]:
        label = f"{row['mode']} {row['max_tokens']}"
        if row.get("skipped"):
            parts.append(f"{label}: {row['skipped']}")
            continue
        graphs = "" if row.get("graphs") is None else f", {row['graphs']} graphs"
        parts.append(f"{label}: epoch 2 {row.get('epoch2_tok_s') or 0:,.0f} tok/s{graphs}")
    return "; ".join(parts)


def fit_answer(out: Path, name: str) -> str | None:
    """A fit's metrics.json: its updates, stop reason, wall time, best validation and test scores."""
    metrics = read_json(out / name)
    if metrics is None:
        return None
    parts = [f"{metrics.get('updates', '?')} updates ({metrics.get('stop_reason', '?')})"]
    if isinstance(metrics.get("wall_time_s"), (int, float)):
        parts.append(f"{metrics['wall_time_s']:.0f} s in all")
    valid = metrics.get("valid") if isinstance(metrics.get("valid"), dict) else {}
    for key in ("bleu", "loss"):
        if isinstance(valid.get(key), (int, float)):
            parts.append(f"valid {key} {valid[key]:.2f}")
            break
    test = metrics.get("test") if isinstance(metrics.get("test"), dict) else {}
    if isinstance(test.get("bleu"), (int, float)):
        parts.append(f"test BLEU {test['bleu']:.2f} ({test.get('decode_sentences_per_s', '?')} sent/s)")
    return ", ".join(parts)


def ddp_answer(out: Path) -> str | None:
    """The DDP fit's metrics, and the process group's backend as its log line says it
    (mtrain.train.distributed: "torch.distributed: rank 0 of 1, backend nccl (DDP)")."""
    answer = fit_answer(out, "ddp_metrics.json")
    log = out / "session.log"
    found = re.findall(r"torch\.distributed: rank \d+ of (\d+), backend (\w+)", log.read_text()) if log.exists() else []
    if answer is None or not found:
        return answer
    ranks, backend = found[-1]
    return f"{answer}; DDP over {backend}, {ranks} rank(s)"


def decode_answer(out: Path) -> str | None:
    rows = read_json(out / "decode.json")
    if not rows:
        return None
    speed = {(row["mode"], row["precision"]): row["sentences_per_s"] for row in rows}
    parts = [f"{mode} {precision} {value:,.1f} sent/s" for (mode, precision), value in speed.items()]
    for mode in dict.fromkeys(mode for mode, _ in speed):
        if (mode, "fp32") in speed and (mode, "bf16") in speed:
            ratio = speed[mode, "bf16"] / max(speed[mode, "fp32"], 1e-9)
            parts.append(f"{mode} bf16/fp32 {ratio:.2f}x")
    return "; ".join(parts)


ANSWERS: dict[str, Callable[[Path], str | None]] = {
    "gpu_check": gpu_check_answer,
    "compile": compile_answer,
    "fit": lambda out: fit_answer(out, "fit_metrics.json"),
    "ddp": ddp_answer,
    "decode": decode_answer,
}


def summarize(out: Path) -> list[dict]:
    steps = []
    lines = (out / "steps.tsv").read_text(encoding="utf-8").splitlines() if (out / "steps.tsv").exists() else []
    for line in lines:
        name, outcome, seconds = line.split("\t")
        answer = ANSWERS[name](out) if name in ANSWERS else None
        steps.append({"step": name, "outcome": outcome, "seconds": int(seconds), "answer": answer})
    return steps


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: gpu_session_summary.py OUT", file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    steps = summarize(out)
    (out / "steps.json").write_text(json.dumps(steps, indent=1) + "\n", encoding="utf-8")
    (out / "steps.tsv").unlink(missing_ok=True)  # steps.json says it all (the tool's file limit)
    print("\n| step | outcome | s | answer |\n|---|---|---:|---|")
    for step in steps:
        print(f"| {step['step']} | {step['outcome']} | {step['seconds']} | {step['answer'] or 'no result'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
