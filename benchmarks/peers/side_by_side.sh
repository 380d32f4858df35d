#!/usr/bin/env bash
# grammarserve vs vLLM vs llama-server, same model (SmolLM2-135M-Instruct Q4_1), same machine,
# one server at a time: start it, wait for health, run every workload of bench_serving.py against
# it, stop it. Every JSON line (tagged "server": NAME) goes to one results file; at the end a
# markdown table with the ratios grammarserve/peer.
#
#   benchmarks/peers/side_by_side.sh [--quick]
#
# Environment (defaults in brackets):
#   SERVERS      [grammarserve vllm llama]   which servers, in this order
#   PORT         [8471]                      one port, reused by each server in turn
#   RESULTS      [/tmp/side_by_side-<time>.jsonl]   results file (appended to)
#   REQUESTS [32] CONCURRENCY [8] MAX_TOKENS [160]  per workload; --quick (or QUICK=1): 4 and 2
#   WARMUP       [1]   untimed requests of each workload before it (0 = measure the cold start)
#   WORKLOADS    [extraction tools tools-strict chat]; also decode (one streamed 256-token
#                reply at a time, EOS ignored: bench_stream.py), extraction-compact,
#                extraction-indented, extraction-none (the few-shot answers written compact,
#                with indent=2, or left out; plain `extraction` is spaced: json.dumps defaults)
#   DUMP_DIR     if set, each run's replies go to $DUMP_DIR/NAME-WORKLOAD.jsonl (--dump-replies)
#   STARTUP_TIMEOUT [1500] seconds (vLLM's first start compiles the model for ~8 min)
#   GS_EXTRA     extra arguments for `grammarserve serve`
#   LOG_DIR      [/tmp]                      server logs: $LOG_DIR/side_by_side-NAME.log
#   plus the variables of start_vllm.sh and start_llama_server.sh (paths under /work/peers)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=$REPO/.venv/bin/python
QUICK=${QUICK:-0}
[ "${1:-}" = "--quick" ] && QUICK=1
if [ "$QUICK" = 1 ]; then
  REQUESTS=${REQUESTS:-4}; CONCURRENCY=${CONCURRENCY:-2}
fi
REQUESTS=${REQUESTS:-32}; CONCURRENCY=${CONCURRENCY:-8}; MAX_TOKENS=${MAX_TOKENS:-160}
WARMUP=${WARMUP:-1}  # untimed requests of each workload first (its shared prompt gets cached)
SERVERS=${SERVERS:-grammarserve vllm llama}
WORKLOADS=${WORKLOADS:-extraction tools tools-strict chat}
PORT=${PORT:-8471}
RESULTS=${RESULTS:-/tmp/side_by_side-$(date +%Y%m%d-%H%M%S).jsonl}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-1500}
LOG_DIR=${LOG_DIR:-/tmp}
BASE=http://127.0.0.1:$PORT
SERVER_PID=

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  # The server runs in its own session (setsid): signal its whole process group (vLLM has an
  # engine-core child process), then wait for it.
  kill -TERM -- "-$SERVER_PID" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=
  sleep 2
}
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() {  # NAME -> sets SERVER_PID, waits for health; returns 1 on failure
  local name=$1 log=$LOG_DIR/side_by_side-$1.log
  case $name in
    grammarserve) setsid "$REPO/.venv/bin/grammarserve" serve --model default --port "$PORT" \
                    ${GS_EXTRA:-} >"$log" 2>&1 & ;;
    vllm)  setsid "$HERE/start_vllm.sh" "$PORT" >"$log" 2>&1 & ;;
    llama) setsid "$HERE/start_llama_server.sh" "$PORT" >"$log" 2>&1 & ;;
    *) echo "unknown server $name" >&2; return 1 ;;
  esac
  SERVER_PID=$!
  local t0=$SECONDS
  while (( SECONDS - t0 < STARTUP_TIMEOUT )); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "# $name exited during start-up; tail of $log:" >&2; tail -20 "$log" >&2
      SERVER_PID=; return 1
    fi
    # /health (all three have it; vLLM answers 200 before the model list is ready on some
    # versions), then /v1/models must answer too.
    if curl -sf -o /dev/null "$BASE/health" && curl -sf -o /dev/null "$BASE/v1/models"; then
      STARTUP_S=$(( SECONDS - t0 ))
      echo "# $name healthy after ${STARTUP_S}s (log: $log)" >&2
      return 0
    fi
    sleep 1
  done
  echo "# $name not healthy after ${STARTUP_TIMEOUT}s; tail of $log:" >&2; tail -20 "$log" >&2
  stop_server; return 1
}

port_busy() { curl -s -o /dev/null --max-time 2 "$BASE/" ; [ $? -ne 7 ]; }

echo "# results: $RESULTS  (requests $REQUESTS, concurrency $CONCURRENCY, max_tokens $MAX_TOKENS)" >&2
for name in $SERVERS; do
  if port_busy; then echo "# port $PORT is in use; set PORT" >&2; exit 1; fi
  if ! start_server "$name"; then
    printf '{"server": "%s", "event": "start_failed"}\n' "$name" >>"$RESULTS"; continue
  fi
  printf '{"server": "%s", "event": "startup", "startup_s": %s}\n' "$name" "$STARTUP_S" >>"$RESULTS"
  # One unmeasured request first so that no workload pays for lazy start-up work.
  "$PY" "$REPO/benchmarks/bench_serving.py" --base-url "$BASE/v1" --workload chat --requests 1 \
    --concurrency 1 --max-tokens 8 >/dev/null 2>&1
  for w in $WORKLOADS; do
    extra=()
    case $w in
      tools-strict) extra=(--workload tools --strict-tools) ;;
      extraction-*) extra=(--workload extraction --few-shot-style "${w#extraction-}") ;;
      *) extra=(--workload "$w") ;;
    esac
    if [ -n "${DUMP_DIR:-}" ]; then
      mkdir -p "$DUMP_DIR"; extra+=(--dump-replies "$DUMP_DIR/$name-$w.jsonl")
    fi
    echo "# $name: $w" >&2
    if [ "$w" = decode ]; then  # single-stream decode speed (bench_stream.py)
      if line=$("$PY" "$REPO/benchmarks/bench_stream.py" --base-url "$BASE/v1" --label "$name"); then
        echo "$line" | tee -a "$RESULTS"
      else
        printf '{"server": "%s", "workload": "decode", "event": "bench_failed"}\n' "$name" >>"$RESULTS"
      fi
      continue
    fi
    if line=$("$PY" "$REPO/benchmarks/bench_serving.py" --base-url "$BASE/v1" --label "$name" \
                "${extra[@]}" --requests "$REQUESTS" --concurrency "$CONCURRENCY" \
                --max-tokens "$MAX_TOKENS" --warmup "$WARMUP"); then
      echo "$line" | tee -a "$RESULTS"
    else
      printf '{"server": "%s", "workload": "%s", "event": "bench_failed"}\n' "$name" "$w" >>"$RESULTS"
    fi
  done
  stop_server
done
echo
"$PY" "$HERE/table.py" "$RESULTS"
