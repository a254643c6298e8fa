#!/usr/bin/env bash
# A local Ray cluster with the dashboard and job server, for `ray job submit` on one machine.
#
#   clusters/local.sh start      # head on 127.0.0.1 (dashboard/jobs on $DASHBOARD_PORT), waits until ready
#   clusters/local.sh submit search_spaces/quickstart.yaml --trials 4 [orchestrator run options]
#   clusters/local.sh stop       # stops this cluster only (its process group), not other Ray clusters
#
# No GPU needed: the simulated engine holds logical GPUs (--num-gpus) exactly as vLLM holds real ones.
# Settings (environment): RAY_LOCAL_DIR (temp dir, pid and log; short path), DASHBOARD_PORT (8265),
# GCS_PORT (6379), NUM_CPUS (4), NUM_GPUS (2), RAY_START_ARGS (more `ray start` flags, e.g. ports),
# RESULTS (output location, default $PWD/results; any path or s3:// / gs:// URI).
# Ray >= 2.52 turns token authentication on for local clusters: this script creates a token in
# $RAY_LOCAL_DIR/auth_token and exports RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH for the head and for `ray job`.
set -euo pipefail

RAY_LOCAL_DIR=${RAY_LOCAL_DIR:-/tmp/ray-tuner}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
GCS_PORT=${GCS_PORT:-6379}
NUM_CPUS=${NUM_CPUS:-4}
NUM_GPUS=${NUM_GPUS:-2}
RAY=${RAY:-ray}
ADDRESS="http://127.0.0.1:${DASHBOARD_PORT}"

export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$RAY_LOCAL_DIR/auth_token" RAY_USAGE_STATS_ENABLED=0

start() {
  mkdir -p "$RAY_LOCAL_DIR"
  if [ -f "$RAY_LOCAL_DIR/head.pid" ] && kill -0 "$(cat "$RAY_LOCAL_DIR/head.pid")" 2>/dev/null; then
    echo "already running (pid $(cat "$RAY_LOCAL_DIR/head.pid")); dashboard $ADDRESS"; return 0
  fi
  [ -s "$RAY_AUTH_TOKEN_PATH" ] || (umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$RAY_AUTH_TOKEN_PATH")
  # --block keeps `ray start` in the foreground of its own session: stopping that process group stops
  # exactly this cluster. setsid makes the group; the pid file names it.
  # shellcheck disable=SC2086  # RAY_START_ARGS is a list of flags
  setsid "$RAY" start --head --block --temp-dir="$RAY_LOCAL_DIR/ray" --port="$GCS_PORT" \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
    --num-cpus="$NUM_CPUS" --num-gpus="$NUM_GPUS" --disable-usage-stats ${RAY_START_ARGS:-} \
    > "$RAY_LOCAL_DIR/head.log" 2>&1 < /dev/null &
  echo $! > "$RAY_LOCAL_DIR/head.pid"
  for _ in $(seq 1 180); do
    if ! kill -0 "$(cat "$RAY_LOCAL_DIR/head.pid")" 2>/dev/null; then
      echo "ray head exited; log: $RAY_LOCAL_DIR/head.log" >&2; tail -20 "$RAY_LOCAL_DIR/head.log" >&2; return 1
    fi
    if grep -q "Ray runtime started" "$RAY_LOCAL_DIR/head.log" && "$RAY" job list --address "$ADDRESS" >/dev/null 2>&1; then
      echo "ray head up: dashboard and jobs at $ADDRESS (log $RAY_LOCAL_DIR/head.log)"; return 0
    fi
    sleep 1
  done
  echo "ray head not ready after 180 s; log: $RAY_LOCAL_DIR/head.log" >&2; return 1
}

submit() {
  [ $# -ge 1 ] || { echo "usage: $0 submit STUDY.yaml [orchestrator run options]" >&2; exit 2; }
  # --working-dir . uploads this checkout (.gitignore and .rayignore keep .venv and results out).
  "$RAY" job submit --address "$ADDRESS" --working-dir . -- \
    orchestrator run "$@" --output "${RESULTS:-$PWD/results}"
}

stop() {
  local pid
  pid=$(cat "$RAY_LOCAL_DIR/head.pid" 2>/dev/null) || { echo "not running"; return 0; }
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 15); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$RAY_LOCAL_DIR/head.pid"
  echo "stopped"
}

case "${1:-}" in
  start) start ;;
  submit) shift; submit "$@" ;;
  stop) stop ;;
  *) echo "usage: $0 start | submit STUDY.yaml [orchestrator run options] | stop" >&2; exit 2 ;;
esac
