"""scripts/gpu_check.sh: its --smoke mode (tiny models, CPU) runs every code path of the GPU check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # CPU even on a GPU machine
    return subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def test_smoke_mode_measures_every_model_and_mode_and_tracks_bf16(tmp_path):
    result = gpu_check("--smoke", "--json", str(tmp_path / "check.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    assert [(run["model"], run["mode"]) for run in report["runs"]] == [
        (model, mode) for model in ("transformer_base", "transformer_big") for mode in ("bf16", "fp32", "bf16+compile")
    ]
    for run in report["runs"]:
        assert run["skipped"] is None and run["updates"] == 3
        assert run["tgt_tokens_per_s"] > 0 and run["src_tgt_tokens_per_s"] > run["tgt_tokens_per_s"]
        assert run["mfu"] is None and run["peak_memory_gib"] > 0  # a CPU has no datasheet peak: no MFU
    tracking = report["tracking"]
    assert tracking["passed"] and tracking["relative_gap"] <= tracking["tolerance"] == 0.02
    assert tracking["final_fp32"] < tracking["first_loss"]  # the synthetic task is learnable
    assert "bf16 vs fp32 (transformer_base" in result.stdout and ": PASS" in result.stdout
    assert "| transformer_big | bf16+compile |" in result.stdout  # a Markdown table for docs/PERFORMANCE.md


def test_full_mode_refuses_to_run_without_a_gpu():
    result = gpu_check("--models", "transformer_base")
    assert result.returncode == 2 and "no CUDA device here" in result.stderr and "--smoke" in result.stderr
