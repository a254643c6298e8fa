# Sourced by the H200 benchmark scripts: start bare `vllm serve` on port 8100 and wait until it answers.
#   start_bare_vllm MODEL_DIR MAX_NUM_SEQS LOG    (sets $server to its pid; exits 1 if it dies first)
start_bare_vllm() {
  local model=$1 seqs=$2 log=$3
  python3 -m vllm.entrypoints.openai.api_server --model "$model" --served-model-name llama-3.1-8b \
    --load-format dummy --max-num-seqs "$seqs" --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 \
    --max-model-len 4096 --port 8100 --disable-uvicorn-access-log --uvicorn-log-level warning > "$log" 2>&1 &
  server=$!
  local t0; t0=$(date +%s)
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8100/health', timeout=2)" 2>/dev/null; do
    kill -0 $server 2>/dev/null || { echo "vllm serve exited"; tail -30 "$log"; exit 1; }
    sleep 1
  done
  echo "vllm serve (max_num_seqs $seqs) up after $(( $(date +%s) - t0 )) s"
}
