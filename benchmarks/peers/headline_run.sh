#!/usr/bin/env bash
# The runs behind README's headline table, one after another, beside vLLM CPU on the same
# weights; raw lines to PREFIX-{quality,clients,serving,batch,spec}.jsonl, then the table:
#
#   benchmarks/peers/headline_run.sh benchmarks/peers/results-DATE-headline
#   .venv/bin/python benchmarks/headline.py --prefix benchmarks/peers/results-DATE-headline --write
#
# Commit the code first: each line records `git describe --dirty`, and headline.py --strict
# accepts only lines of HEAD's code. vLLM from /work/peers (install_vllm.sh); its first start
# compiles for minutes. Environment: OURS_PORT [8200], VLLM_PORT [8100], SKIP ("spec batch" ...
# to leave parts out).
set -uo pipefail
PREFIX=${1:?usage: headline_run.sh PREFIX}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=$REPO/.venv/bin/python
OURS_PORT=${OURS_PORT:-8200}
VLLM_PORT=${VLLM_PORT:-8100}
SKIP=${SKIP:-}
cd "$REPO"

wait_health() {  # URL SECONDS
  for _ in $(seq "$2"); do curl -sf "$1/health" > /dev/null && return 0; sleep 1; done
  echo "no health at $1" >&2; return 1
}

"$HERE/start_vllm.sh" "$VLLM_PORT" > /tmp/headline-vllm.log 2>&1 &
VLLM_PID=$!
"$PY" -m grammarserve serve --port "$OURS_PORT" > /tmp/headline-ours.log 2>&1 &
OURS_PID=$!
trap 'kill $OURS_PID $VLLM_PID 2>/dev/null; wait 2>/dev/null' EXIT
wait_health "http://127.0.0.1:$OURS_PORT" 300 || exit 1
wait_health "http://127.0.0.1:$VLLM_PORT" 1500 || exit 1

"$PY" benchmarks/bench_quality.py --ours default= --ours "nospec=--num-speculative-tokens 0" \
  --peer "vllm=http://127.0.0.1:$VLLM_PORT" --docs 5 >> "$PREFIX-quality.jsonl"
for side in grammarserve vllm; do
  port=$OURS_PORT; [ "$side" = vllm ] && port=$VLLM_PORT
  "$PY" benchmarks/bench_clients.py --cold --url "http://127.0.0.1:$port" --label "$side" \
    >> "$PREFIX-clients.jsonl"
done
for round in 1 2; do  # two rounds, interleaved
  for side in grammarserve vllm; do
    port=$OURS_PORT; [ "$side" = vllm ] && port=$VLLM_PORT
    "$PY" benchmarks/bench_serving.py --workload extraction --base-url "http://127.0.0.1:$port/v1" \
      --label "$side" >> "$PREFIX-serving.jsonl"
  done
done
kill $OURS_PID $VLLM_PID 2>/dev/null; wait 2>/dev/null
if [[ " $SKIP " != *" batch "* ]]; then
  for style in zeroshot no_json; do
    "$PY" benchmarks/peers/batch_side_by_side.py --lines 64 --max-tokens 320 \
      --workload array_of_objects --prompt-style "$style" >> "$PREFIX-batch.jsonl"
  done
fi
if [[ " $SKIP " != *" spec "* ]]; then
  "$PY" benchmarks/bench_spec.py --parts single >> "$PREFIX-spec.jsonl"
fi
