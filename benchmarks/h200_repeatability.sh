#!/usr/bin/env bash
# The repeatability benchmark on one H200 (docs/benchmarks.md, "Repeatability"): one bare
# `vllm serve` with vLLM's defaults, measured by search_spaces/repeatability-h200.yaml once per seed.
#   bash benchmarks/h200_repeatability.sh MODEL_DIR RESULTS SEEDS [RATE]
# SEEDS: e.g. 0-2 (a device call lasts at most 10 minutes: about three capacity searches);
# RATE: also one 12 s window at this rate for seeds 0-4 (TTFT p50/p99, TPOT p50).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
model=$1 out=$2 seeds=$3 rate=${4:-}
mkdir -p "$out"
python3 -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name llama-3.1-8b \
  --load-format dummy --max-num-seqs 1024 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
  --max-model-len 4096 --port 8100 --disable-uvicorn-access-log --uvicorn-log-level warning \
  > "$out/server.log" 2>&1 &
server=$!
t0=$(date +%s)
until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8100/health', timeout=2)" 2>/dev/null; do
  kill -0 $server 2>/dev/null || { echo "vllm serve exited"; tail -30 "$out/server.log"; exit 1; }
  sleep 1
done
echo "server up after $(( $(date +%s) - t0 )) s"
python3 benchmarks/repeatability.py run search_spaces/repeatability-h200.yaml --seeds "$seeds" --output "$out"
rc=$?
if [ -n "$rate" ]; then
  python3 benchmarks/repeatability.py run search_spaces/repeatability-h200.yaml --seeds 0-4 --output "$out" \
    --rate "$rate" --duration 12 || rc=$?
fi
kill $server; wait $server 2>/dev/null
python3 benchmarks/repeatability.py table "$out"
exit $rc
