#!/usr/bin/env bash
# Prepare what a bare GPU machine lacks for scripts/gpu_session.sh, in .gpu_carry/ (ignored by
# git; the device tool carries it with `carry: [".gpu_carry"]`):
#   .gpu_carry/wheels/  hydra-core, omegaconf and antlr4-python3-runtime (pure Python), the
#                       packages mtrain needs that the GPU image does not have (torch,
#                       sentencepiece, sacrebleu, tensorboard, protobuf, tqdm, pyyaml are there;
#                       datasets is only imported for a Hub corpus, ctranslate2 only when asked);
#   .gpu_carry/data/    Multi30k from $MTRAIN_DATA_DIR (2 MB): ../shared does not travel.
# Run it here (it needs the package registry), once per checkout:
#   scripts/gpu_carry.sh && du -sh .gpu_carry
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu_carry
DATA="${MTRAIN_DATA_DIR:-$(cd .. && pwd)/shared/data}"
PY="${PYTHON:-python3}"
rm -rf "$CARRY" && mkdir -p "$CARRY/wheels" "$CARRY/data"
# The versions this checkout runs with here (pyproject.toml bounds them); antlr4 4.9.3 has no
# wheel on PyPI, so pip builds one (pure Python, any Python 3).
versions=$("$PY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(hydra-core|omegaconf|antlr4-python3-runtime)==' || true)
[ -n "$versions" ] || versions=$'hydra-core==1.3.2\nomegaconf==2.3.0\nantlr4-python3-runtime==4.9.3'
# shellcheck disable=SC2086
"$PY" -m pip wheel -q --no-deps -w "$CARRY/wheels" $versions
cp -r "$DATA/multi30k" "$CARRY/data/"
chmod -R u+w "$CARRY/data"
echo "$versions" > "$CARRY/VERSIONS"
ls "$CARRY/wheels"
