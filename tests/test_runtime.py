"""mtrain.runtime: which precision `auto` picks on a CPU, whatever instruction set torch may use."""

import subprocess
import sys

import pytest
import torch

from mtrain import runtime
from mtrain.config import Precision
from mtrain.errors import MtrainError

_AUTO_ON_CPU = (
    "import torch; from mtrain.runtime import resolve_precision; print(resolve_precision('auto', torch.device('cpu')))"
)


@pytest.mark.parametrize(
    "isa, expected", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True), ("ALL", True)]
)
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


@pytest.mark.parametrize("has_bf16,expected", [(True, Precision.bf16), (False, Precision.fp32)])
def test_auto_decodes_in_bf16_only_on_cpus_with_bf16_products(monkeypatch, has_bf16, expected):
    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: has_bf16)
    assert runtime.resolve_decode_precision("auto", torch.device("cpu")) is expected
    assert runtime.resolve_decode_precision("bf16", torch.device("cpu")) is Precision.bf16
    with pytest.raises(MtrainError, match="precision='fp8'"):
        runtime.resolve_decode_precision("fp8", torch.device("cpu"))


@pytest.mark.parametrize("gpu_has_bf16,expected", [(True, Precision.bf16), (False, Precision.fp32)])
def test_auto_decodes_in_bf16_on_gpus_with_bf16(monkeypatch, gpu_has_bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: gpu_has_bf16)
    assert runtime.resolve_decode_precision("auto", torch.device("cuda")) is expected
    assert runtime.resolve_decode_precision("fp32", torch.device("cuda")) is Precision.fp32


def test_decoding_leaves_cudnn_attention_out_on_cuda_only():
    """cuDNN's attention builds a plan per new shape; a decode has new shapes at every step."""
    flags = (
        torch.backends.cuda.cudnn_sdp_enabled,
        torch.backends.cuda.flash_sdp_enabled,
        torch.backends.cuda.mem_efficient_sdp_enabled,
        torch.backends.cuda.math_sdp_enabled,
    )
    before = [flag() for flag in flags]
    assert before[0]  # torch's default: cuDNN allowed
    with runtime.decoding_attention_kernels(torch.device("cuda")):
        assert [flag() for flag in flags] == [False, True, True, True]
    assert [flag() for flag in flags] == before
    with runtime.decoding_attention_kernels(torch.device("cpu")):
        assert [flag() for flag in flags] == before


@pytest.mark.parametrize("has_bf16", [True, False])
def test_a_run_validates_in_fp32_when_it_trains_in_fp32_else_in_what_decodes_fastest(monkeypatch, has_bf16):
    monkeypatch.setattr(runtime, "cpu_has_bf16_matmul", lambda: has_bf16)
    cpu = torch.device("cpu")
    assert runtime.decode_precision_of_training(Precision.fp32, cpu) is Precision.fp32
    expected = Precision.bf16 if has_bf16 else Precision.fp32
    assert runtime.decode_precision_of_training(Precision.bf16, cpu) is expected


def test_a_precision_knows_its_dtype_its_autocast_and_its_ctranslate2_compute_type():
    assert [p.dtype for p in (Precision.fp32, Precision.bf16, Precision.fp16)] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ]
    assert [p.is_low for p in Precision] == [False, False, True, True]  # auto, fp32, bf16, fp16
    assert [p.ct2_compute_type for p in Precision] == ["default", "float32", "bfloat16", "float16"]
    with pytest.raises(ValueError, match="resolve it"):
        _ = Precision.auto.dtype
    cpu = torch.device("cpu")
    with runtime.autocast(cpu, Precision.bf16):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with runtime.autocast(cpu, Precision.fp32):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(MtrainError, match="fp16 needs a CUDA device"):
        runtime.resolve_precision("fp16", cpu)


@pytest.fixture
def restored_tf32_flags():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


def test_set_tf32_sets_the_cuda_products_precision_both_apis_read_back(restored_tf32_flags):
    runtime.set_tf32(torch.device("cuda"), True)  # (setting flags needs no GPU)
    assert torch.backends.cuda.matmul.fp32_precision == "tf32" and torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    runtime.set_tf32(torch.device("cuda:0"), False)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee" and not torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    runtime.set_tf32(torch.device("cpu"), True)  # a CPU run leaves them alone
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32


def test_the_device_lines_say_how_fp32_products_run():
    assert runtime.describe_device(torch.device("cpu"), True) == "cpu"
    assert runtime.describe_device(torch.device("cuda:0"), True) == "cuda:0 (fp32 products in TF32)"
    assert runtime.describe_device(torch.device("cuda:0"), False) == "cuda:0 (fp32 products in full fp32, tf32=false)"


@pytest.mark.parametrize("tf32", [True, False])
def test_train_tf32_reaches_the_setter(monkeypatch, tf32):
    from mtrain.config import FitConfig
    from mtrain.train import setup

    calls = []
    monkeypatch.setattr(setup, "set_tf32", lambda device, enabled: calls.append((device.type, enabled)))
    monkeypatch.setattr(setup, "set_threads", lambda threads: None)
    cfg = FitConfig()
    cfg.train.device, cfg.train.tf32 = "cpu", tf32
    setup.resolve_machine(cfg)
    assert calls == [("cpu", tf32)]
