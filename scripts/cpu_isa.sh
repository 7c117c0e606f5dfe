# Sourced by the CPU side-by-side scripts: with AVX2=1, limit torch (ATen, oneDNN) and
# CTranslate2 to AVX2, a stand-in for a CPU without AVX-512 and bf16 instructions (MKL's fp32
# products take their AVX2 path on AMD CPUs anyway); `precision=auto` then trains in fp32.
# Sets CPU_HEADER, the CPU's flags for the first line of every report.
if [ "${AVX2:-0}" = 1 ]; then export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2; fi
CPU_HEADER="# $(lscpu | grep -o 'avx2\|avx512_bf16\|amx_bf16' | sort -u | tr '\n' ' ')| AVX2-limited: ${AVX2:-0}"
