#!/usr/bin/env bash
# The one prepared GPU check, for a lent GPU (<= 8 minutes on one H100/H200). Writes its
# figures under OUT (default: ./gpu_session): gpu.json and gpu.log (training speed of
# transformer_base/big in bf16, fp32, bf16+compile, each row with its own time limit; bf16
# tracking fp32; a torch.profiler breakdown of transformer_big bf16), fit.log and
# m30k_gpu/metrics.json (the multi30k_gpu preset: 3 minutes, test BLEU), decode.json
# (beam 5 and greedy on the GPU, fp32 and bf16). Each step has its own time limit, so a
# stuck one is reported and the rest still run.
#
#   OUT=/tmp/gpu scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_session}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
export PYTHONUNBUFFERED=1 MTRAIN_DATA_DIR="${MTRAIN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# /'

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*"
  timeout --signal=TERM --kill-after=20 "$limit" "$@"
  local status=$?
  [ $status -eq 0 ] || echo "== $name: exit status $status$([ $status -eq 124 ] && echo ' (time limit)')"
}

step gpu_check 240 scripts/gpu_check.sh --profile --json "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
step fit 240 "$PY" -m mtrain fit experiment=multi30k_gpu hydra.run.dir="$OUT/m30k_gpu" 2>&1 | tee "$OUT/fit.log"
step decode 60 "$PY" scripts/bench_decode.py --run "$OUT/m30k_gpu" --devices cuda --cache on \
  --precisions fp32,bf16 --modes greedy,beam5 --ct2 "" --json "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log"
