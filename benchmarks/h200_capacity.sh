#!/usr/bin/env bash
# The H200 capacity study (docs/benchmarks.md, "H200 capacity study"), on one GPU node with vLLM + Ray.
#   bash benchmarks/h200_capacity.sh reference MODEL_DIR RESULTS   # hand-tuned setting through bare vllm serve
#   bash benchmarks/h200_capacity.sh study N RESULTS               # N more trials of the search (resumes)
# MODEL_DIR: a config.json + tokenizer directory (load_format dummy). RESULTS: the output folder.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "$1" in
  reference)
    model=$2 out=$3
    python3 -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name llama-3.1-8b \
      --load-format dummy --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
      --max-model-len 4096 --port 8100 --disable-uvicorn-access-log --uvicorn-log-level warning \
      > "$out/reference_server.log" 2>&1 &
    server=$!
    t0=$(date +%s)
    until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8100/health', timeout=2)" 2>/dev/null; do
      kill -0 $server 2>/dev/null || { echo "vllm serve exited"; tail -30 "$out/reference_server.log"; exit 1; }
      sleep 1
    done
    echo "reference server up after $(( $(date +%s) - t0 )) s"
    python3 -m orchestrator run search_spaces/llama3-8b-h200-reference.yaml --output "$out"
    rc=$?
    kill $server; wait $server 2>/dev/null
    exit $rc ;;
  study)
    python3 -m orchestrator run search_spaces/llama3-8b-h200.yaml --output "$3" --max-trials "$2" ;;
  *) echo "usage: $0 reference MODEL_DIR RESULTS | study N RESULTS" >&2; exit 2 ;;
esac
