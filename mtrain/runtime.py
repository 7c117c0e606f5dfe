"""Device, precision and threads: what any stage needs from the machine.

A shared core below the pipeline packages: training (`mtrain.train`) and decoding
(`mtrain.decode`) both resolve `device=` and `precision=` here, so decoding never imports
the trainer's package. Random state and its checkpointing stay in `mtrain.train.random_state`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable

import torch

from mtrain.config import Precision
from mtrain.errors import MtrainError

# ideep, the oneDNN binding behind torch's bf16 products on a CPU, keeps one primitive per
# product shape in an LRU cache of 1,024 (env LRU_CACHE_CAPACITY, read at the first such
# product), each holding its own buffers. Training batches and decoding steps bring a new shape
# almost every time, so the cache mostly misses while it grows: it held ~200 MB of a bf16
# training run and ~450 MB of a bf16 test decode (multi30k_cpu_best; 64: same speed).
# A user's own setting wins; 0 crashes torch 2.13.
BF16_SHAPE_CACHE = 64
os.environ.setdefault("LRU_CACHE_CAPACITY", str(BF16_SHAPE_CACHE))


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> the local rank's GPU if CUDA is usable, else the CPU."""
    if name == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise MtrainError(f"device={name!r}: not a device name (auto, cpu, cuda, cuda:N)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MtrainError(f"device={name}: CUDA is not available on this machine; use device=cpu or auto")
    return device


# oneDNN instruction-set caps (ONEDNN_MAX_CPU_ISA) under which its bf16 products are emulated.
_ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_has_bf16_matmul() -> bool:
    """True on CPUs with bf16 matrix instructions (AVX512-BF16 or AMX) that torch may use, where
    bf16 pays off.

    The hardware is not the whole answer: ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2
    (a container pinned to a lower instruction set, or a stand-in for an AVX2-only CPU) make
    bf16 products emulated, ~100x slower than fp32 ones, so they count as having none.
    """
    hardware = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    aten_capped = torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2", "ZVECTOR", "VSX")
    onednn_capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() in _ONEDNN_ISAS_WITHOUT_BF16
    return bool(hardware) and not aten_capped and not onednn_capped


def as_precision(name: Precision | str) -> Precision:
    """A precision name as the enum; an unknown name is an MtrainError listing the choices."""
    try:
        return Precision(name)
    except ValueError as error:
        choices = "|".join(member.value for member in Precision)
        raise MtrainError(f"precision={name!r}: choose one of {choices}") from error


def check_precision(precision: Precision, device: torch.device) -> None:
    """Raise for a precision that `device` cannot run."""
    if precision is Precision.fp16 and device.type != "cuda":
        raise MtrainError("precision=fp16 needs a CUDA device; use bf16 or fp32 on CPU")


def resolve_precision(name: Precision | str, device: torch.device) -> Precision:
    """Training's precision: auto -> bf16 where the hardware trains it fast, else fp32.

    On this project's CPUs bf16 autocast trains ~2x faster per minute than fp32 at the
    same BLEU per update (scripts/bench_train.py; figures in docs/PERFORMANCE.md).
    """
    precision = as_precision(name)
    check_precision(precision, device)
    if precision is not Precision.auto:
        return precision
    if device.type == "cuda":
        return Precision.bf16 if torch.cuda.is_bf16_supported() else Precision.fp16
    return Precision.bf16 if cpu_has_bf16_matmul() else Precision.fp32


def resolve_decode_precision(name: Precision | str, device: torch.device) -> Precision:
    """Decoding's precision: auto -> what decodes faster (scripts/bench_decode.py, Multi30k
    test_2016_flickr, a 3+3 layer d_model 256 model):

    - CPU with bf16 matrix instructions (AVX512-BF16 or AMX): bf16, 1.2-2.4x faster than fp32
      (1 thread, depending on the machine's load) at the same BLEU. Other CPUs emulate bf16
      products (~1 GFLOP/s): fp32.
    - CUDA with bf16 (Ampere and later): bf16. The one GPU measurement (H200, torch 2.11) had
      bf16 decoding 18-23x slower than fp32 (beam 5 67 vs 1,240 sent/s) for two reasons, both
      removed since: autocast cast every weight at every step (mtrain.decode.engines.torch_engine now
      casts them once), and sdpa sent each bf16 attention call to cuDNN, which builds an
      execution plan for every new shape, and a decode's shapes change at every step
      (`decoding_attention_kernels` leaves cuDNN out; fp32 never used it). Not yet measured on a
      GPU since: the GPU session's decode step (scripts/gpu_session.sh) compares the two.
      Otherwise fp32 (fp16 decoding is only ever asked for).
    Scores and log-softmax stay fp32 either way.
    """
    precision = as_precision(name)
    check_precision(precision, device)
    if precision is not Precision.auto:
        return precision
    if device.type == "cuda":
        return Precision.bf16 if torch.cuda.is_bf16_supported() else Precision.fp32
    if device.type == "cpu" and cpu_has_bf16_matmul():
        return Precision.bf16
    return Precision.fp32


def decode_precision_of_training(precision: Precision, device: torch.device) -> Precision:
    """What a training run validates and tests in: fp32 when it trains in fp32, else what
    decodes fastest on `device` (see resolve_decode_precision)."""
    return Precision.fp32 if precision is Precision.fp32 else resolve_decode_precision(Precision.auto, device)


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager[object]:
    """The autocast context for a resolved precision (a no-op for fp32)."""
    if not Precision(precision).is_low:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=Precision(precision).dtype)


def decoding_attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """sdpa's backends while decoding: on CUDA every one but cuDNN's (a no-op elsewhere).

    torch >= 2.10 with the cuDNN it bundles (>= 9.15) tries cuDNN's attention first on sm90/sm100
    for bf16/fp16 calls, and cuDNN builds an execution plan (tens to hundreds of ms) for every
    input shape it has not seen. Training meets a few shapes (bucketed batches); a decode meets
    new ones at every step (the self-attention keys grow by one, finished sentences leave the
    batch): ~170 distinct shapes in a beam-5 decode of 200 sentences (scripts/profile_decode.py),
    the likely cause of bf16 decoding 18x slower than fp32 on an H200. Flash attention takes
    the unmasked calls, memory-efficient attention the masked ones; fp32 never reaches cuDNN, so
    its outputs are unchanged. The backend flags are process-wide while the context is open.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def set_tf32(device: torch.device, enabled: bool) -> None:
    """TF32 for fp32 matrix products on CUDA (`train.tf32`, `tf32=` of the decoding commands):
    tensor cores at ~8x full fp32's rate (H100: 494 against 67 TFLOP/s dense), with fp32's range
    and a 10-bit mantissa, the precision bf16 autocast already trades for more. It reaches the
    fp32 runs and what autocast leaves in fp32. On a CPU nothing is set.

    torch 2.13 has two ways to say it. Its new per-backend `fp32_precision` flags, set for
    cuBLAS alone, make `torch.get_float32_matmul_precision()` raise (mixed legacy and new
    settings), and inductor's autotuning cache reads it; `set_float32_matmul_precision`
    ("high": TF32) sets cuBLAS and oneDNN consistently, so both ways read back the same.
    """
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled  # (cuDNN's convolutions: none in this model, set for consistency)


def describe_device(device: torch.device, tf32: bool) -> str:
    """The device as the lines naming it say it: on CUDA with how fp32 products run (`set_tf32`)."""
    if device.type != "cuda":
        return str(device)
    return f"{device} (fp32 products in {'TF32' if tf32 else 'full fp32, tf32=false'})"


def set_threads(num_threads: int | None) -> None:
    if num_threads:
        torch.set_num_threads(num_threads)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


def release_free_host_memory() -> bool:
    """Return the C heap's free pages to the operating system; False where that is unsupported.

    A CPU training run allocates and frees its activations every update, in shapes that change
    from batch to batch; glibc keeps the freed blocks mapped, scattered through its heap, so the
    process's resident memory climbs well above what it uses (multi30k_cpu_best, bf16, 200 updates:
    1,184 MB, 1,075-1,084 MB trimming every 10 at the same speed; `scripts/bench_train.py
    --trim-every`, docs/PERFORMANCE.md).
    Trimming every update would cost speed: the pages are faulted back in.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def peak_host_memory_mb(reset: bool = False) -> float | None:
    """The process's peak resident memory in MB (Linux: VmHWM) since it started or since the
    last `reset=True`, which starts a new peak from the current resident size; None where the
    system does not say. Where the kernel refuses the reset, peaks stay cumulative: a later
    phase's then includes the earlier phases'."""
    peak = None
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
    except OSError:
        return None
    if reset:
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # 5: reset the peak resident set size (Linux >= 4.0)
        except OSError:
            pass
    return peak


def process_started() -> float | None:
    """When this process started, on `time.monotonic()`'s clock (Linux: /proc/self/stat's
    start time against /proc/uptime), so a command's wall time counts Python's start-up and
    imports too; None where the system does not say."""
    import time

    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        age = since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the line: starttime
    except (OSError, ValueError, IndexError):
        return None
    return time.monotonic() - max(age, 0.0)
