#!/usr/bin/env bash
# The whole benchmark (../shared/BENCHMARK.md) for mtrain and fairseq at the same time, one
# thread each, so both see the same machine in the same minutes (issue 16's 20-minute row):
# `mtrain fit experiment=$PRESET` and fairseq's tuned recipe, each for BUDGET_MIN minutes of
# training, then each decodes test_2016_flickr (beam 5) and scores it.
#   MTRAIN_DATA_DIR=../shared/data bash scripts/cpu_budget_side_by_side.sh             # ~25 minutes
#   AVX2=1 UPM=45 bash scripts/cpu_budget_side_by_side.sh    # limited to AVX2 (scripts/cpu_isa.sh)
# UPM: fairseq's expected updates per minute, which sizes its linear decay (the tuned recipe
# decays to 0 at UPM x BUDGET_MIN updates); mtrain's schedule follows the clock by itself.
# Prints mtrain's summary (updates, tok/s, val ppl, test BLEU/chrF, decode speed, peak RSS)
# and fairseq's JSON line.
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET_MIN="${BUDGET_MIN:-20}" PRESET="${PRESET:-multi30k_cpu}" UPM="${UPM:-45}"
. scripts/cpu_isa.sh
RUN="${RUN:-runs/side_by_side_$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RUN"
echo "$CPU_HEADER | $BUDGET_MIN min, 1 thread each"
/usr/bin/time -f "mtrain peak RSS %M kB" mtrain fit "experiment=$PRESET" "hydra.run.dir=$RUN/mtrain" \
  "train.max_train_time=${BUDGET_MIN}m" train.max_time=null train.num_threads=1 > "$RUN/mtrain.log" 2>&1 &
MTRAIN_PID=$!
THREADS=1 RECIPE=tuned UPM="$UPM" BUDGET_MIN="$BUDGET_MIN" bash ../shared/peers/fairseq/run.sh \
  > "$RUN/fairseq.out" 2> "$RUN/fairseq.err" &
FAIRSEQ_PID=$!
wait "$MTRAIN_PID"; wait "$FAIRSEQ_PID"
echo "## mtrain $PRESET"
grep -E "valid \||test \||peak RSS" "$RUN/mtrain.log" | tail -3
python -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$RUN/mtrain/metrics.json"
echo "## fairseq 0.12.3 tuned"
tail -1 "$RUN/fairseq.out"
