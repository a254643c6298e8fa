#!/usr/bin/env bash
# The repeatability benchmark on one GPU (docs/benchmarks.md, "Repeatability"): one bare `vllm serve`
# with vLLM's defaults, measured by search_spaces/repeatability-h200.yaml (or the study file STUDY names,
# e.g. search_spaces/repeatability-h100.yaml on an H100) once per seed.
#   bash benchmarks/h200_repeatability.sh MODEL_DIR RESULTS SEEDS [RATE]
# SEEDS: e.g. 0-1 (a device call lasts at most 10 minutes: a cold server start and two capacity searches);
# RATE: also one 12 s window at this rate for seeds 0-4 (TTFT p50/p99, TPOT p50).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source benchmarks/bare_vllm.sh
model=$1 out=$2 seeds=$3 rate=${4:-}
mkdir -p "$out"
start_bare_vllm "$model" 1024 "$out/server.log"
# A call that ends early (its time limit) must not leave the server holding the GPU.
trap 'kill $server 2>/dev/null' EXIT INT TERM
python3 benchmarks/repeatability.py run "${STUDY:-search_spaces/repeatability-h200.yaml}" --seeds "$seeds" --output "$out"
rc=$?
if [ -n "$rate" ]; then
  python3 benchmarks/repeatability.py run "${STUDY:-search_spaces/repeatability-h200.yaml}" --seeds 0-4 --output "$out" \
    --rate "$rate" --duration 12 || rc=$?
fi
kill $server; wait $server 2>/dev/null
python3 benchmarks/repeatability.py table "$out"
exit $rc
