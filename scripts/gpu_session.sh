#!/usr/bin/env bash
# The one prepared GPU check, for a lent GPU: at most SESSION_SECONDS (default 470: one device
# call of 8 minutes) on one H100/H200. Writes its figures under OUT (default: ./gpu_session),
# eight files, the device tool's limit:
#   gpu.json, gpu.log          bf16 tracking fp32; bf16 training speed of transformer_base/big at
#                              16k tokens; a torch.profiler breakdown of transformer_big bf16
#   compile.json, compile.log  transformer_base bf16, eager vs compiled vs graph-captured
#                              (train.cuda_graphs) at 4k, 16k and 64k tokens a batch, each over two
#                              epochs: epoch 1's tok/s (every shape met first) against epoch 2's
#   fit.log, fit_metrics.json  the multi30k_gpu preset: 3 minutes, test BLEU
#   decode.json, decode.log    beam 5 and greedy on the GPU, fp32 and bf16 (500 test sentences)
# Each step has its own time limit, cut to what is left of SESSION_SECONDS, so a stuck step is
# reported and the rest still run, and the whole fits the call.
#
# A bare GPU machine lacks hydra-core, omegaconf and antlr4 and has no ../shared: prepare them
# here with scripts/gpu_carry.sh, then, with the device tool, one call:
#   run(command="OUT=$OUT scripts/gpu_session.sh", carry=[".gpu_carry"], timeout_s=490)
# SMOKE=1 rehearses every step on a CPU in a few minutes (tiny models and budgets), e.g. in a
# virtualenv holding only what the GPU image holds (docs/PERFORMANCE.md, GPU section).
#
#   OUT=/tmp/gpu scripts/gpu_session.sh
#   SMOKE=1 OUT=/tmp/gpu-rehearsal scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_session}"
SMOKE="${SMOKE:-0}"
SESSION_SECONDS="${SESSION_SECONDS:-470}"
# The run itself (checkpoints, TensorBoard) stays outside OUT: the device tool brings back at
# most 8 files; OUT gets its metrics.json.
RUN="${RUN:-/tmp/mtrain-gpu-session/m30k_gpu}"
mkdir -p "$OUT"
rm -rf "$RUN"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if [ -d .gpu_carry/wheels ]; then  # what the GPU image lacks (scripts/gpu_carry.sh)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
    .gpu_carry/wheels/*.whl || { echo "== the carried wheels do not install"; exit 1; }
  export PYTHONPATH="/tmp/gpu-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "${MTRAIN_DATA_DIR:-}" ]; then
  if [ -d .gpu_carry/data/multi30k ]; then MTRAIN_DATA_DIR=$PWD/.gpu_carry/data; else MTRAIN_DATA_DIR=$(cd .. && pwd)/shared/data; fi
fi
export MTRAIN_DATA_DIR
"$PY" -c "import torch, hydra, omegaconf, sentencepiece, sacrebleu, mtrain; print('# torch', torch.__version__, '| hydra', hydra.__version__, '| cuda', torch.cuda.is_available())" \
  || { echo "== mtrain does not import: run scripts/gpu_carry.sh here and carry .gpu_carry"; exit 1; }
if [ "$SMOKE" = 1 ]; then  # a CPU rehearsal: every step, tiny
  CHECK=(--smoke --profile --models transformer_base --modes bf16)
  COMPILE=(--smoke --pairs 400)
  FIT=(train.device=cpu train.max_train_time=20s train.max_time=null train.validate_every_time=10s model.d_model=64 model.heads=2
       model.ffn_dim=128 model.encoder_layers=1 model.decoder_layers=1 train.max_tokens=1024 data.train_limit=2000
       train.valid_max_sentences=50 tokenizer.vocab_size=1000 decode.beam=2 data.cache_dir="$(dirname "$RUN")/cache")
  DECODE=(--devices cpu --sentences 20)
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# /'
  # bf16 rows only: fp32 is checked by the tracking, compile by bench_compile (time is short)
  CHECK=(--profile --modes bf16 --seconds 5 --budget 75)
  COMPILE=(--budget 145)
  FIT=()
  DECODE=(--devices cuda --sentences 500)
fi

step() {  # step NAME SECONDS COMMAND...: at most SECONDS, and never past SESSION_SECONDS of the script
  local name=$1 limit=$2; shift 2
  local left=$((SESSION_SECONDS - SECONDS))
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 10 ]; then echo "== $name: skipped, the session's ${SESSION_SECONDS}s are spent"; return; fi
  echo "== $name (limit ${limit}s, at ${SECONDS}s): $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  local status=$?
  [ $status -eq 0 ] || echo "== $name: exit status $status$([ $status -eq 124 ] && echo ' (time limit)')"
}

step gpu_check 80 env PYTHON="$PY" scripts/gpu_check.sh "${CHECK[@]}" --json "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
step compile 150 "$PY" scripts/bench_compile.py "${COMPILE[@]}" --json "$OUT/compile.json" 2>&1 | tee "$OUT/compile.log"
step fit 210 "$PY" -m mtrain fit experiment=multi30k_gpu "${FIT[@]}" hydra.run.dir="$RUN" 2>&1 | tee "$OUT/fit.log"
cp "$RUN/metrics.json" "$OUT/fit_metrics.json" 2>/dev/null
step decode 60 "$PY" scripts/bench_decode.py --run "$RUN" "${DECODE[@]}" --cache on \
  --precisions fp32,bf16 --modes greedy,beam5 --ct2 "" --json "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log"
echo "== session: ${SECONDS}s of ${SESSION_SECONDS}s"
