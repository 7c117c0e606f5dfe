#!/usr/bin/env bash
# GPU check: tokens/s, MFU and peak memory of transformer_base and transformer_big in
# fp32, bf16 and bf16+compile on synthetic batches, and whether bf16 training loss tracks
# fp32 (within 2%). Under 4 minutes on one H100/H200-class GPU; exit status 1 if bf16 does
# not track fp32. The work is in scripts/gpu_check.py (see its --help).
#
#   scripts/gpu_check.sh                       # the first visible GPU
#   CUDA_VISIBLE_DEVICES=3 scripts/gpu_check.sh --json gpu_check.json
#   scripts/gpu_check.sh --smoke               # tiny models, any machine: checks the script
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " != *" --smoke "* ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv,noheader \
    | sed 's/^/# nvidia-smi: /'
fi
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
