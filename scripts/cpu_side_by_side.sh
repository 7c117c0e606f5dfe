#!/usr/bin/env bash
# mtrain against fairseq on the CPU benchmark, back to back on this machine (issue 16):
# bench_train (fp32 with the full and the target-side softmax, bf16), fairseq's tuned recipe
# for BUDGET_MIN minutes, then bench_train again; with AVX2=1 every kernel is limited to AVX2
# (scripts/cpu_isa.sh), a stand-in for a CPU without AVX-512 and bf16 instructions.
#   MTRAIN_DATA_DIR=../shared/data bash scripts/cpu_side_by_side.sh            # ~12 minutes
#   AVX2=1 UPDATES=150 BUDGET_MIN=3 bash scripts/cpu_side_by_side.sh
# fairseq's figure is `train_tgt_tok_per_s` of the JSON line it prints last.
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATES="${UPDATES:-150}" BUDGET_MIN="${BUDGET_MIN:-3}"
. scripts/cpu_isa.sh
echo "$CPU_HEADER"
bench() {  # bench VOCAB PRECISIONS
  python scripts/bench_train.py experiment=multi30k_cpu "model.output_vocab=$1" --updates "$UPDATES" --warmup 5 \
    --threads 2 --precisions "$2" | grep -E '^ +(fp32|bf16) ' | sed "s/^/mtrain softmax=$1 /"
}
# bf16 only where it is not emulated (`precision=auto` picks fp32 on an AVX2-limited run)
PRECISIONS=fp32,bf16; [ "${AVX2:-0}" = 1 ] && PRECISIONS=fp32
echo "## mtrain before fairseq"
bench full fp32
bench target "$PRECISIONS"
echo "## fairseq 0.12.3 tuned, $BUDGET_MIN minutes"
/usr/bin/time -f "fairseq peak RSS %M kB" env RECIPE=tuned BUDGET_MIN="$BUDGET_MIN" \
  bash ../shared/peers/fairseq/run.sh 2>/tmp/fairseq-side-by-side.err | tail -1
grep "peak RSS" /tmp/fairseq-side-by-side.err
echo "## mtrain after fairseq"
bench target fp32
bench full fp32
