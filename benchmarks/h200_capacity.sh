#!/usr/bin/env bash
# The H200 capacity study (docs/benchmarks.md, "H200 capacity study"), on one GPU node with vLLM + Ray.
#   bash benchmarks/h200_capacity.sh reference MODEL_DIR RESULTS   # hand-tuned setting through bare vllm serve
#   bash benchmarks/h200_capacity.sh study N RESULTS               # N more trials of the search (resumes)
# MODEL_DIR: a config.json + tokenizer directory (load_format dummy). RESULTS: the output folder.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source benchmarks/bare_vllm.sh
case "$1" in
  reference)
    model=$2 out=$3
    start_bare_vllm "$model" 256 "$out/reference_server.log"
    python3 -m orchestrator run search_spaces/llama3-8b-h200-reference.yaml --output "$out"
    rc=$?
    kill $server; wait $server 2>/dev/null
    exit $rc ;;
  study)
    python3 -m orchestrator run search_spaces/llama3-8b-h200.yaml --output "$3" --max-trials "$2" ;;
  *) echo "usage: $0 reference MODEL_DIR RESULTS | study N RESULTS" >&2; exit 2 ;;
esac
