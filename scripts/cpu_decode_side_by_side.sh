#!/usr/bin/env bash
# Beam-5 decoding of test_2016_flickr, back to back on a quiet machine: mtrain (fp32, and bf16
# where the CPU has bf16 instructions) and CTranslate2 on the same weights (bench_decode.py), and
# fairseq-generate on a fairseq run of ../shared/peers/fairseq/run.sh, all with THREADS threads.
#   bash scripts/cpu_decode_side_by_side.sh runs/m30k /tmp/mtrain-peers/runs/fairseq-DATE
#   AVX2=1 bash scripts/cpu_decode_side_by_side.sh ...     # limited to AVX2 (scripts/cpu_isa.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="$1" FAIRSEQ_WORK="$2" THREADS="${THREADS:-2}"
PEERS="${PEERS:-${TMPDIR:-/tmp}/mtrain-peers}"
. scripts/cpu_isa.sh
PRECISIONS=fp32,bf16; [ "${AVX2:-0}" = 1 ] && PRECISIONS=fp32  # bf16 would be emulated
echo "$CPU_HEADER | $THREADS threads"
python scripts/bench_decode.py --run "$RUN" --modes beam5 --cache on --precisions "$PRECISIONS" \
  --threads "$THREADS" --ct2 float32 | grep -E '^\||CTranslate2'
OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 \
  "$PEERS/fairseq/bin/fairseq-generate" "$PEERS/data/fairseq-bin" --path "$FAIRSEQ_WORK/ckpt/checkpoint_last.pt" \
  --gen-subset test --source-lang de --target-lang en --beam 5 --remove-bpe sentencepiece --cpu 2>&1 \
  | grep -E 'Translated [0-9,]+ sentences' | sed 's/^.*Translated/fairseq: translated/'
