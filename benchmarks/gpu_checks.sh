#!/usr/bin/env bash
# The GPU checks and benchmarks, on a GPU machine that has only torch, transformers, sentencepiece,
# safetensors, sacrebleu, pyarrow and triton (no Ray, no CTranslate2), in three parts of under 10
# minutes each, with data-gpu/ copied beside the checkout (benchmarks/gpu_prepare.sh):
#                                    bash benchmarks/gpu_checks.sh 1   # tests, the product, ours vs HF, kernels
#                                    bash benchmarks/gpu_checks.sh 2   # the papers' tables (batching, top-up, search)
#                                    bash benchmarks/gpu_checks.sh 3   # bf16, WMT22, the synthetic base model
# Writes full logs and the reports under $OUT (or out-gpu/); every bench_gpu report is written table
# by table, so a call cut short keeps what it finished. Prints the short tables last.
# SMOKE=1 DEVICE=cpu runs every stage on the CPU, tiny, without the GPU tests
# (tests/benchmarks/test_gpu_checks.py, marked slow): the commands and arguments checked first.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-1}
device=${DEVICE:-cuda}
out=${OUT:-out-gpu}
smoke=()
if [ -n "${SMOKE:-}" ]; then
  smoke=(--lines 8 --repeats 1 --capacities 4 --hf-batches 4 --batching-beams 2 --batch-sentences 4 --search-beam 3
         --output-rows 4 --device "$device")
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1 RAYMT_SHARED_DATA=data-gpu
name=$(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
  | grep -oiE 'h100|h200|a100|l4|l40s|t4|v100|cpu' | head -1 | tr A-Z a-z)
bench() {  # bench <seconds> <report name> <bench_gpu args...>
  local seconds=$1 report=$2; shift 2
  timeout "$seconds" python3 -m benchmarks.bench_gpu --data data-gpu --shortlist data-gpu/lex.s2t \
    --out "$out/gpu-${name:-gpu}-$report" "$@" "${smoke[@]}" >> "$out/bench-$report.log" 2>&1
  echo "bench_gpu $report: exit $?"
}
if [ "$stage" = 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
    | tee -a "$out/gpu.txt"
  if [ -z "${SMOKE:-}" ]; then
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/workers/test_gpu.py 2>&1 | tail -30 \
      | tee "$out/tests-gpu.log"
    timeout 60 python3 -m pytest -q -p no:cacheprovider tests/workers/test_triton_ops.py 2>&1 | tail -15 \
      | tee "$out/tests-triton.log"
  fi
  input=data-gpu/multi30k/test_2016_flickr.de
  if [ -n "${SMOKE:-}" ]; then head -n 24 "$input" > "$out/smoke.de"; input=$out/smoke.de; fi
  # the product end to end on the GPU (in-process: no Ray there): the dynamic step at 256 slots, then
  # the GPU's defaults (no batching flags: 1024 slots fitted to memory, static step, refill at 5%)
  for mode in dynamic defaults; do
    flags=(); [ "$mode" = dynamic ] && flags=(--max-batch-size 256 --static-step 0)
    start=$(date +%s%N)
    timeout 60 python3 -m raymt.jobs.translate --in-process --device "$device" "${flags[@]}" --model models/demo-de-en \
      --input "$input" --output "$out/m30k-$mode.en" >> "$out/translate.log" 2>&1
    echo "raymt.jobs.translate $mode: exit $?, $(( ($(date +%s%N) - start) / 1000000 )) ms" | tee -a "$out/translate.log"
  done
  a=$out/m30k-dynamic.en b=$out/m30k-defaults.en  # (other GEMM shapes per step: a rare near-tie may flip)
  cmp -s "$a" "$b" && echo "defaults = dynamic output" \
    || echo "defaults != dynamic output: $(diff "$a" "$b" | grep -c '^<') of $(wc -l < "$a") lines differ"
  bench 300 m30k --sets multi30k --tables peers,output
elif [ "$stage" = 2 ]; then
  bench 520 m30k-seeds --sets multi30k --tables batching,topup,search
else
  bench 200 m30k-bf16 --sets multi30k --tables peers --bf16 --hf-batches 128,512
  bench 330 wmt22 --sets wmt22 --beams 5 --tables peers --hf-batches 128,512 --repeats 2 --synthetic-base
fi
for f in "$out"/bench-*.log; do echo "== $f"; tail -3 "$f"; done
grep -h -A14 "^## " "$out"/gpu-*.md 2>/dev/null | cut -c1-160 | head -160
