"""scripts/gpu_check.sh: its --smoke mode (tiny models, CPU) runs every code path of the GPU check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}  # CPU even on a GPU machine
    return subprocess.run(
        [str(REPO / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


def test_smoke_mode_measures_every_mode_and_tracks_bf16(tmp_path):
    """One model: in smoke mode transformer_big is the same tiny model as transformer_base (its
    rows ran the same code, three processes more: a third of the test's time)."""
    result = gpu_check("--smoke", "--profile", "--models", "transformer_base", "--json", str(tmp_path / "check.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    assert [(run["model"], run["mode"]) for run in report["runs"]] == [
        ("transformer_base", mode) for mode in ("bf16", "fp32", "bf16+compile")
    ]
    for run in report["runs"]:
        assert run["skipped"] is None and run["updates"] == 3
        # compile rows: one static graph per batch shape (shape buckets), so at most one per
        # batch of the 1 warm-up + 3 timed updates (measured: 3 shapes, 3 graphs)
        if run["mode"].endswith("compile"):
            assert 1 <= run["recompiles"] <= 4
        else:
            assert run["recompiles"] is None
        assert (run["profile"] is not None) == ((run["model"], run["mode"]) == ("transformer_base", "bf16"))
        assert run["tgt_tokens_per_s"] > 0 and run["src_tgt_tokens_per_s"] > run["tgt_tokens_per_s"]
        assert run["mfu"] is None and run["peak_memory_gib"] > 0  # a CPU has no datasheet peak: no MFU
    tracking = report["tracking"]
    assert tracking["passed"] and tracking["relative_gap"] <= tracking["tolerance"] == 0.02
    assert tracking["final_fp32"] < tracking["first_loss"]  # the synthetic task is learnable
    assert "bf16 vs fp32 (transformer_base" in result.stdout and ": PASS" in result.stdout
    assert "| transformer_base | bf16+compile |" in result.stdout  # a Markdown table for docs/PERFORMANCE.md
    profile = report["runs"][0]["profile"]
    assert profile["updates"] == 5 and profile["wall_ms_per_update"] > 0 and len(profile["top"]) == 12
    assert sum(row["share"] for row in profile["top"]) <= 1.0 and "aten::mm" in {row["name"] for row in profile["top"]}
    assert "profile of transformer_base bf16, 5 updates" in result.stdout
    # the smoke takes sdpa (a GPU's attention path): a CPU runs its flash kernel, 3 calls an update
    assert profile["sdpa"]["calls_per_update"] == {"flash (CPU)": 3.0} and profile["compiled_graphs"] == 0
    assert "sdpa: flash (CPU) 3/update; torch.compile graphs in this row: 0" in result.stdout


def test_every_row_has_its_own_time_limit(tmp_path):
    """A row that does not finish (a compile that never ends) is reported, and the next runs."""
    result = gpu_check(
        "--smoke",
        "--models",
        "transformer_base",
        "--modes",
        "fp32,bf16+compile",
        "--row-timeout",
        "0.5",
        "--json",
        str(tmp_path / "check.json"),
    )
    report = json.loads((tmp_path / "check.json").read_text())
    assert result.returncode == 1 and report["tracking"] is None  # bf16 tracking was not measured
    assert "bf16 vs fp32: not measured: timed out after 1 s" in result.stdout
    assert [(run["mode"], run["skipped"]) for run in report["runs"]] == [
        ("fp32", "timed out after 0.5 s"),
        ("bf16+compile", "timed out after 1 s"),
    ]
    assert "| transformer_base | bf16+compile | skipped: timed out after 1 s" in result.stdout


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_attention_kernels_are_sorted_by_backend_from_their_names():
    """Kernel names as a GPU's profiler shows them (torch 2.x on sm90)."""
    backend = load_gpu_check().attention_kernel_backend
    assert backend("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1") == "cudnn"
    assert backend("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>, true>(Params)") == (
        "flash"
    )
    assert backend("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>::Params)") == (
        "efficient"
    )
    assert backend("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)") == (
        "efficient"
    )
    assert backend("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") is None
    assert backend("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>") is None


def test_the_sdpa_line_names_each_backend_or_says_there_was_no_call():
    sdpa_line = load_gpu_check().sdpa_line
    sdpa = {"calls_per_update": {"flash": 12.0, "efficient": 6.0}, "device_ms_per_update": {"flash": 1.94}}
    assert sdpa_line(sdpa) == "sdpa: efficient 6/update, flash 12/update (1.94 ms)"
    empty = {"calls_per_update": {}, "device_ms_per_update": {}}
    assert sdpa_line(empty) == "sdpa: no call (attention_impl=math: matmul and softmax)"
