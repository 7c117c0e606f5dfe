"""scripts/bench_compile.py: its --smoke mode (tiny models, CPU) runs the code path of the
eager / compiled / graph-captured comparison that gpu_session.sh runs on a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from tests.warm_process import run_python

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_compile.py"


def test_smoke_mode_times_two_epochs_of_the_graph_captured_step(tmp_path):
    """One mode, one size: the graphs mode compiles (and in smoke takes the captured step's path);
    eager and compile rows run the same code with less of it."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = [str(SCRIPT), "--smoke", "--modes", "graphs", "--max-tokens", "1024", "--pairs", "300"]
    result = run_python(*command, "--json", str(tmp_path / "bench.json"), text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    [row] = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert (row["mode"], row["max_tokens"], row["skipped"]) == ("graphs", 1024, None)
    # one static graph per batch shape (shape buckets), built in epoch 1
    assert row["batches_per_epoch"] > 5 and 1 < row["shapes"] <= 8 and row["graphs"] == row["shapes"]
    assert row["epoch1_tok_s"] > 0 and row["epoch2_tok_s"] > 0 and row["first_update_s"] > 0
    assert "| graphs | 1,024 |" in result.stdout


def test_the_table_orders_rows_by_size_and_compares_epoch_two_with_eager():
    spec = importlib.util.spec_from_file_location("bench_compile", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_compile", bench)  # its dataclass looks its module up
    spec.loader.exec_module(bench)
    rows = [
        bench.Row("graphs", 4096, 10, 8, 30.0, 150.0, 300.0, 1),
        bench.Row("eager", 4096, 10, 8, 0.5, 100.0, 100.0),
        bench.Row("compile", 4096, skipped="timed out after 90 s"),
    ]
    lines = bench.table(rows).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| eager", "| compile", "| graphs"]
    assert "skipped: timed out after 90 s" in lines[3] and "| 0.50 |" in lines[4]  # epoch 1 at half epoch 2's speed
    assert bench.speedups(rows) == "graphs 3.00x eager at 4,096"
