#!/usr/bin/env bash
# Prepare, on a machine with ../shared and eflomal, what a GPU machine without them needs:
#   bash benchmarks/gpu_prepare.sh            -> data-gpu/ (git-ignored; copy it to the GPU machine)
# Copies the test sets bench_gpu and the -m gpu tests read, and builds the word-alignment
# shortlist (Multi30k train, eflomal) that bench_gpu's shortlist x pruning table uses.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${RAYMT_SHARED_DATA:-../shared/data}
mkdir -p data-gpu/multi30k data-gpu/wmt22
cp "$shared"/multi30k/test_2016_flickr.{de,en} data-gpu/multi30k/
cp "$shared"/wmt22/generaltest2022.de-en.{src.de,ref.A.en} data-gpu/wmt22/
if [ ! -s data-gpu/lex.s2t ]; then
  python3 -m raymt.jobs.build_shortlist --model models/demo-de-en --source "$shared"/multi30k/train.de \
    --target "$shared"/multi30k/train.en --output data-gpu/lex.s2t
fi
du -sh data-gpu
