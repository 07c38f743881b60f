#!/usr/bin/env bash
# One prepared run on a lent GPU machine (torch there, nothing to fetch): the CUDA tests that need no gradio, the
# launcher on the demo model, then bench/gpu.py's PARTS (default: decode profile quant, --compile left out: its first
# answer alone takes minutes). Wheels the machine lacks travel in .whl/ (transformers, bitsandbytes, torchao) and
# are installed under /tmp/site. Logs and figures go to $OUT (default /tmp/gpu-check).
#   bash bench/gpu_check.sh [PART ...]        (TESTS=0 leaves the tests and the launcher out)
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) && export TORCHINDUCTOR_CACHE_DIR  # empty: a first launch's
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
SECONDS=0
if [ "${TESTS:-1}" != 0 ]; then
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "graphs or cuda_answers" 2>&1 \
  | tail -40 | tee "$OUT/tests.log"
echo "tests: ${SECONDS}s"
timeout 120 python3 demos/generate.py --device cuda --dtype bf16 --output "$OUT/generate.jsonl" \
  --prompts "What is the capital of France?" "Who are you?" 2>&1 | tail -8 | tee "$OUT/generate.log"
echo "generate: ${SECONDS}s"
fi
timeout "${BENCH_TIMEOUT:-420}" python3 -m bench.gpu --only ${@:-decode profile quant} --no_compile --out "$OUT" 2>&1 \
  | grep -v "Loading weights\|Writing model" | tee "$OUT/bench.log" | tail -60
echo "bench: ${SECONDS}s"
