#!/usr/bin/env bash
# Everything issue 16 measures, in one call on a lent GPU machine (torch, transformers,
# sentencepiece, safetensors, sacrebleu, pyarrow, triton; no Ray, no CTranslate2):
#   device run, carry ["data-gpu"]:  bash jobs/gpu_checks.sh
# Writes full logs and the reports under $OUT (or out-gpu/); prints the short tables last.
# A full bench_gpu run may not fit one 10-minute call: split it with BENCH_ARGS, e.g.
#   BENCH_ARGS="--sets multi30k" bash jobs/gpu_checks.sh, then --sets wmt22 --tables peers,batching.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 RAYMT_SHARED_DATA=data-gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/workers/test_gpu.py 2>&1 | tail -30 | tee "$out/tests-gpu.log"
python3 -m pytest -q -p no:cacheprovider tests/workers/test_triton_ops.py 2>&1 | tail -15 | tee "$out/tests-triton.log"
for n in 0 4; do  # the product end to end on the GPU (in-process: no Ray there), dynamic vs static step
  start=$(date +%s%N)
  python3 -m jobs.translate --in-process --device ${DEVICE:-cuda} --batching topup --max-batch-size 256 --static-step $n \
    --model models/demo-de-en --input data-gpu/multi30k/test_2016_flickr.de --output "$out/m30k-static$n.en" \
    >> "$out/translate.log" 2>&1
  echo "jobs.translate --static-step $n: exit $?, $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$out/translate.log"
done
cmp -s "$out/m30k-static0.en" "$out/m30k-static4.en" && echo "static = dynamic output" || echo "static != dynamic output"
name=$(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | grep -oiE 'h100|h200|a100|l4|l40s|t4|v100|cpu' | head -1 | tr A-Z a-z)
timeout ${BENCH_SECONDS:-420} python3 -m jobs.bench_gpu --data data-gpu --shortlist data-gpu/lex.s2t \
  --out "$out/gpu-${name:-gpu}" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1
echo "bench_gpu exit $?"; tail -5 "$out/bench.log"
grep -h -A12 "^## " "$out"/gpu-*.md 2>/dev/null | head -150
