#!/usr/bin/env bash
# The one prepared GPU check, for a lent GPU: at most SESSION_SECONDS (default 470: one device
# call of 8 minutes) on one H100/H200. Writes its answers under OUT (default: ./gpu_session),
# seven files (the device tool brings back at most eight):
#   session.log        everything the steps print, in order, and the summary table at the end
#   steps.json         per step: status (ok, failed, time limit, skipped), seconds, its answer
#   gpu.json           bf16 tracking fp32; bf16 training speed of transformer_base/big at 16k
#                      tokens; a torch.profiler breakdown of transformer_big bf16: top kernels by
#                      GPU time, device-busy share, the sdpa backend of each attention call
#   compile.json       transformer_base bf16, eager vs compiled vs graph-captured
#                      (train.cuda_graphs) at 4k, 16k and 64k tokens a batch, each over two
#                      epochs: epoch 1's tok/s against epoch 2's, graphs built (recompiles)
#   fit_metrics.json   the multi30k_gpu preset in its step's time (train.max_time from the
#                      step's limit, so that it ends with its test BLEU)
#   ddp_metrics.json   the same preset for a few dozen updates under torchrun, one process on
#                      the GPU in a process group of one: DDP over NCCL
#   decode.json        beam 5 and greedy on the GPU, fp32 and bf16 (500 test sentences)
# Each step has its own time limit, cut to what is left of SESSION_SECONDS, so a stuck step is
# reported and the rest still run, and the whole fits the call.
#
# A bare GPU machine lacks hydra-core, omegaconf and antlr4 and has no ../shared: prepare them
# here with scripts/gpu_carry.sh, then, with the device tool, one call:
#   run(command="OUT=$OUT scripts/gpu_session.sh", carry=[".gpu_carry"], timeout_s=490)
# SMOKE=1 rehearses every step on a CPU (tiny models and budgets; what needs CUDA is skipped and
# says so): ~40 s of CPU time, 1-3 minutes on 2 shared cores; tests/test_gpu_session.py runs it.
#
#   OUT=/tmp/gpu scripts/gpu_session.sh
#   SMOKE=1 OUT=/tmp/gpu-rehearsal scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_session}"
SMOKE="${SMOKE:-0}"
SESSION_SECONDS="${SESSION_SECONDS:-470}"
# The runs themselves (checkpoints, TensorBoard) stay outside OUT; OUT gets their metrics.json.
WORK="${WORK:-/tmp/mtrain-gpu-session}"
RUN="$WORK/m30k_gpu"
DDP_RUN="$WORK/m30k_ddp"
mkdir -p "$OUT"
rm -rf "$RUN" "$DDP_RUN" "$OUT/session.log" "$OUT/steps.tsv"
exec > >(tee -a "$OUT/session.log") 2>&1
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

# Seconds per step (each cut to what is left of the session), in the order they run.
# The environment may raise them (the CPU rehearsal's test does: on loaded cores a step's CPU time
# stretches 3-5x, and the rehearsal checks that every step answers, not how fast).
LIMIT_CHECK=${LIMIT_CHECK:-70} LIMIT_COMPILE=${LIMIT_COMPILE:-95} LIMIT_FIT=${LIMIT_FIT:-180}
LIMIT_DDP=${LIMIT_DDP:-45} LIMIT_DECODE=${LIMIT_DECODE:-45}
DDP_UPDATES=40
# What a fit spends outside its own clock (interpreter, imports, CUDA start, the process's end):
# its train.max_time is the step's limit less this.
FIT_MARGIN=25
if [ "$SMOKE" = 1 ]; then  # a CPU rehearsal: every step, tiny
  LIMIT_FIT=60 FIT_MARGIN=15 DDP_UPDATES=4
  # A slice of Multi30k (1,000 training pairs, 30 validation, 40 test), so that the tokenizer, the
  # validations and the test decode take seconds.
  mkdir -p "$WORK/data/multi30k"
  for split_size in train:1000 val:30 test_2016_flickr:40; do
    for lang in de en; do
      zcat "$MTRAIN_DATA_DIR/multi30k/${split_size%:*}.$lang.gz" | head -n "${split_size#*:}" | gzip > "$WORK/data/multi30k/${split_size%:*}.$lang.gz"
    done
  done
  export MTRAIN_DATA_DIR="$WORK/data"
  CHECK=(--smoke --profile --models transformer_base --modes bf16 --track-updates 12 --seconds 1 --profile-updates 2)
  COMPILE=(--smoke --pairs 200 --max-tokens 2048 --modes eager,compile)
  TINY=(train.device=cpu model.d_model=64 model.heads=2 model.ffn_dim=128 model.encoder_layers=1 model.decoder_layers=1
        train.max_tokens=1024 tokenizer.vocab_size=500 data.cache_dir="$WORK/cache"
        train.warmup_updates=10 train.log_every_time=5s train.num_threads=1)
  FIT=("${TINY[@]}" train.max_train_time=null train.validate_every_time=5s decode.beam=2)
  DDP=("${TINY[@]}")
  DECODE=(--devices cpu --sentences 8 --threads 1)
  echo "# SMOKE=1 on a CPU: CUDA-only parts skipped: NCCL (the ddp step's group runs gloo), CUDA graph capture" \
    "(compile runs eager and compile only), GPU kernel times and the device-busy share, decoding on CUDA (here on the CPU)"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# /'
  # bf16 rows only: fp32 is checked by the tracking, compile by bench_compile (time is short)
  CHECK=(--profile --modes bf16 --seconds 5 --budget 65)
  COMPILE=(--budget 90)
  FIT=()
  DDP=()
  DECODE=(--devices cuda --sentences 500)
fi

step_limit() {  # step_limit SECONDS: SECONDS, or what is left of the session if that is less
  local left=$((SESSION_SECONDS - SECONDS))
  if [ "$1" -le "$left" ]; then echo "$1"; else echo "$left"; fi
}

step() {  # step NAME SECONDS COMMAND...: at most SECONDS (see step_limit); a line in steps.tsv
  local name=$1 limit; limit=$(step_limit "$2"); shift 2
  if [ "$limit" -lt 10 ]; then
    echo "== $name: skipped, the session's ${SESSION_SECONDS}s are spent"
    printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
    return
  fi
  echo "== $name (limit ${limit}s, at ${SECONDS}s): $*"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  local status=$? outcome=ok
  if [ $status -eq 124 ]; then outcome="time limit"; elif [ $status -ne 0 ]; then outcome="exit status $status"; fi
  [ $status -eq 0 ] || echo "== $name: $outcome"
  printf '%s\t%s\t%s\n' "$name" "$outcome" $((SECONDS - start)) >> "$OUT/steps.tsv"
}

step gpu_check $LIMIT_CHECK env PYTHON="$PY" scripts/gpu_check.sh "${CHECK[@]}" --json "$OUT/gpu.json"
step compile $LIMIT_COMPILE "$PY" scripts/bench_compile.py "${COMPILE[@]}" --json "$OUT/compile.json"
fit_limit=$(step_limit $LIMIT_FIT)
step fit "$fit_limit" "$PY" -m mtrain fit experiment=multi30k_gpu "${FIT[@]}" \
  train.max_time=$((fit_limit > FIT_MARGIN + 10 ? fit_limit - FIT_MARGIN : 10))s hydra.run.dir="$RUN"
cp "$RUN/metrics.json" "$OUT/fit_metrics.json" 2>/dev/null
# One process in a process group of one (mtrain.train.distributed): NCCL on a GPU, gloo on a CPU.
# The preset's time budget and timed validation give way to a fixed count of updates.
step ddp $LIMIT_DDP env NCCL_DEBUG=VERSION \
  "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m mtrain fit experiment=multi30k_gpu "${DDP[@]}" \
  train.max_updates=$DDP_UPDATES train.max_time=null train.max_train_time=null train.warmup_time=null \
  train.validate_every_time=null train.validate_every=100000 train.valid_bleu=false data.splits.test=null \
  hydra.run.dir="$DDP_RUN"
cp "$DDP_RUN/metrics.json" "$OUT/ddp_metrics.json" 2>/dev/null
if [ -f "$RUN/checkpoints/best.pt" ] || [ -f "$RUN/checkpoints/last.pt" ]; then
  step decode $LIMIT_DECODE "$PY" scripts/bench_decode.py --run "$RUN" "${DECODE[@]}" --cache on \
    --precisions fp32,bf16 --modes greedy,beam5 --ct2 "" --json "$OUT/decode.json"
else
  echo "== decode: skipped, the fit step left no checkpoint"
  printf 'decode\tskipped\t0\n' >> "$OUT/steps.tsv"
fi
echo "== session: ${SECONDS}s of ${SESSION_SECONDS}s"
"$PY" scripts/gpu_session_summary.py "$OUT"
