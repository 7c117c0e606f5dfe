"""scripts/gpu_session.sh: its CPU rehearsal (SMOKE=1) runs every step and each answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = ["gpu_check", "compile", "fit", "ddp", "decode"]


@pytest.mark.slow  # ~40 s of CPU time: 1 minute on 2 idle cores, 3 on loaded ones
def test_the_rehearsal_runs_every_step_and_each_reports_its_answer(tmp_path, data_dir):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "SMOKE": "1",
        "OUT": str(out),
        "WORK": str(tmp_path / "work"),
        "PYTHON": sys.executable,
        "MTRAIN_DATA_DIR": str(data_dir),
        "CUDA_VISIBLE_DEVICES": "",  # the CPU rehearsal even on a GPU machine
        "PYTHONPATH": str(REPO),
        # generous limits but the fit's (its train.max_time comes from its limit): the steps'
        # CPU time stretches on loaded cores, and this test checks answers, not speed
        "SESSION_SECONDS": "1500",
        **{f"LIMIT_{step}": "300" for step in ("CHECK", "COMPILE", "DDP", "DECODE")},
    }
    result = subprocess.run(
        [str(REPO / "scripts" / "gpu_session.sh")], capture_output=True, text=True, env=env, cwd=REPO, timeout=1500
    )
    assert result.returncode == 0, result.stdout[-3000:]
    steps = json.loads((out / "steps.json").read_text())
    assert [step["step"] for step in steps] == STEPS
    assert all(step["outcome"] == "ok" and step["answer"] for step in steps), steps
    answers = {step["step"]: step["answer"] for step in steps}
    assert "bf16 tracks fp32: PASS" in answers["gpu_check"] and "sdpa flash (CPU)" in answers["gpu_check"]
    assert "compile 2048: epoch 2" in answers["compile"] and "graphs" in answers["compile"]
    assert "test BLEU" in answers["fit"]  # the fit ended within its step's limit, with its test score
    assert answers["ddp"].startswith("4 updates (max_updates") and answers["ddp"].endswith("DDP over gloo, 1 rank(s)")
    assert "beam5 bf16/fp32" in answers["decode"]
    assert "CUDA-only parts skipped" in result.stdout
    # the device tool brings back at most 8 files
    assert len(list(out.iterdir())) <= 8
    assert "| step | outcome | s | answer |" in (out / "session.log").read_text()
