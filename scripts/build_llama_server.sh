#!/usr/bin/env bash
# Build llama-server from the llama.cpp source vendored in the llama-cpp-python sdist,
# for kvsim's end-to-end validation (tests/e2e/test_llama_server.py).
#
# The binary is cached by version outside the clone and reused when present:
#   ${KVSIM_CACHE:-$HOME/.cache/kvsim}/llama-server-<version>/bin/llama-server
# A cold build takes 10-25 minutes on 2 cores (measured here). Prints the binary path on stdout.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
PREFIX="$CACHE/llama-server-$VERSION"
BIN="$PREFIX/bin/llama-server"
JOBS="${KVSIM_BUILD_JOBS:-2}"
PY="${PYTHON:-python3}"

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "kvsim: building llama-server from llama-cpp-python==$VERSION in $WORK" >&2
"$PY" -m pip download -q --no-binary :all: --no-deps -d "$WORK/sdist" "llama-cpp-python==$VERSION" >&2
tar -xzf "$WORK"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$WORK/build" --target llama-server -j"$JOBS" >&2

# NOTE: install atomically: copy next to the final path, then rename, so a killed
# build never leaves a half-written binary that later runs would reuse.
mkdir -p "$PREFIX/bin"
cp "$WORK/build/bin/llama-server" "$BIN.tmp.$$"
chmod +x "$BIN.tmp.$$"
mv -f "$BIN.tmp.$$" "$BIN"
echo "$BIN"
