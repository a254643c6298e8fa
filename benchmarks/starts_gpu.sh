#!/usr/bin/env bash
# Engine starts as replicates on one GPU (docs/benchmarks.md, "Engine starts as replicates"): for each
# configuration named, one bare `vllm serve` start measured by search_spaces/starts-h100.yaml's capacity
# search (the external engine, seed 0: every start replays the same requests), then the server stopped.
#   bash benchmarks/starts_gpu.sh MODEL_DIR RESULTS "defaults tuned defaults"
# Each configuration's starts are numbered on from those already in RESULTS (k1, k2, ...).
# defaults: max_num_seqs 1024, max_num_batched_tokens 8192 (vLLM 0.26's own on an H100); tuned: 256, 512.
# A device call lasts at most 10 minutes: a start and its search take ~3 minutes; a start that would not
# finish within DEADLINE_S (default 560) of the call's beginning is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
model=$1 out=$2 configs=$3
study=${STUDY:-search_spaces/starts-h100.yaml}
prefix=$(sed -n 's/^name: *//p' "$study")
mkdir -p "$out"
t_begin=$(date +%s)
rc=0
for config in $configs; do
  case $config in
    defaults) seqs=1024 tokens=8192 ;;
    tuned) seqs=256 tokens=512 ;;
    *) echo "unknown configuration $config"; exit 2 ;;
  esac
  k=$(( $(ls -d "$out"/$prefix-$config-k*-s0 2>/dev/null | wc -l) + 1 ))
  if (( $(date +%s) - t_begin > ${DEADLINE_S:-560} - ${START_S:-200} )); then
    echo "skipped $config start $k: not enough of the call left"; continue
  fi
  t0=$(date +%s)
  log="$out/server-$config-k$k.log"
  # the marks orchestrator/engines/vllm/start_log.py reads: the process's start and the server answering
  echo "# started $(date -u '+%Y-%m-%d %H:%M:%S.%6N')" > "$log"
  python3 -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name llama-3.1-8b \
    --load-format dummy --max-num-seqs $seqs --max-num-batched-tokens $tokens --gpu-memory-utilization 0.9 \
    --max-model-len 4096 --port 8100 --disable-uvicorn-access-log --uvicorn-log-level warning \
    >> "$log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null' EXIT INT TERM
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8100/health', timeout=2)" 2>/dev/null; do
    kill -0 $server 2>/dev/null || { echo "vllm serve exited"; tail -30 "$log"; exit 1; }
    sleep 1
  done
  echo "# ready $(date -u '+%Y-%m-%d %H:%M:%S.%6N')" >> "$log"
  echo "$config start $k: vllm serve up after $(( $(date +%s) - t0 )) s"
  python3 benchmarks/repeatability.py run "$study" --seeds 0 --output "$out" --label "$prefix-$config-k$k" \
    --params "{\"max_num_seqs\": $seqs, \"max_num_batched_tokens\": $tokens}" || rc=$?
  kill $server; wait $server 2>/dev/null
  echo "$config start $k: done after $(( $(date +%s) - t0 )) s"
  sleep 2  # the GPU's memory back before the next start
done
exit $rc
