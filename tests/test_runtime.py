"""mtrain.runtime: which precision `auto` picks on a CPU, whatever instruction set torch may use."""

import subprocess
import sys

import pytest
import torch

from mtrain import runtime

_AUTO_ON_CPU = "import torch; from mtrain.runtime import resolve_precision; print(resolve_precision('auto', torch.device('cpu')))"


@pytest.mark.parametrize("isa, expected", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True), ("ALL", True)])
def test_a_onednn_cap_below_bf16_means_no_bf16_products(monkeypatch, isa, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert runtime.cpu_has_bf16_matmul() is expected


def test_without_bf16_hardware_there_are_no_bf16_products(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert runtime.cpu_has_bf16_matmul() is False
    assert runtime.resolve_precision("auto", torch.device("cpu")) == "fp32"


def test_auto_trains_in_fp32_when_torch_is_limited_to_avx2():
    """ATEN_CPU_CAPABILITY=avx2 stands in for an AVX2-only CPU: bf16 would be emulated there."""
    env = {"ATEN_CPU_CAPABILITY": "avx2", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", _AUTO_ON_CPU], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "fp32"
