#!/usr/bin/env bash
# Build llama-server, llama-bench and llama-batched-bench from the llama.cpp source
# vendored in the llama-cpp-python sdist, for kvsim's end-to-end validation
# (tests/e2e/test_llama_server.py) and the llama-bench readers' fixtures
# (kvsim.validate.llamabench, tests/validate/data).
#
# The binaries are cached by version outside the clone and reused when all three exist:
#   ${KVSIM_CACHE:-$HOME/.cache/kvsim}/llama-server-<version>/bin/{llama-server,llama-bench,llama-batched-bench}
# A cache that lacks any of them is rebuilt (the build tree is not kept).
# A cold build takes 10-25 minutes on 2 cores (measured here); the two bench tools add
# ~15 s to it: they share llama, ggml and common with llama-server (one 2-core run:
# llama-server 374 s, then llama-bench + llama-batched-bench 14 s more).
# Prints the llama-server path on stdout; the bench tools lie beside it.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${KVSIM_CACHE:-$HOME/.cache/kvsim}"
PREFIX="$CACHE/llama-server-$VERSION"
BIN="$PREFIX/bin/llama-server"
TOOLS=(llama-server llama-bench llama-batched-bench)
JOBS="${KVSIM_BUILD_JOBS:-2}"
PY="${PYTHON:-python3}"

have_all() {
  local t
  for t in "${TOOLS[@]}"; do
    [ -x "$PREFIX/bin/$t" ] || return 1
  done
}

if have_all; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "kvsim: building ${TOOLS[*]} from llama-cpp-python==$VERSION in $WORK" >&2
"$PY" -m pip download -q --no-binary :all: --no-deps -d "$WORK/sdist" "llama-cpp-python==$VERSION" >&2
tar -xzf "$WORK"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

# NOTE: llama-server, llama-bench and llama-batched-bench all live under tools/
# (LLAMA_BUILD_TOOLS, on by default for a top-level build; set here so a changed
# default cannot drop them); LLAMA_BUILD_EXAMPLES covers only examples/ and stays off.
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON >&2
start=$SECONDS
cmake --build "$WORK/build" --target llama-server -j"$JOBS" >&2
echo "kvsim: llama-server built in $((SECONDS - start)) s" >&2
start=$SECONDS
cmake --build "$WORK/build" --target llama-bench llama-batched-bench -j"$JOBS" >&2
echo "kvsim: llama-bench, llama-batched-bench built in $((SECONDS - start)) s more" >&2

# NOTE: install atomically: copy next to the final path, then rename, so a killed
# build never leaves a half-written binary that later runs would reuse; llama-server
# goes last, so its presence never hides a missing bench tool from a caller.
mkdir -p "$PREFIX/bin"
for t in llama-bench llama-batched-bench llama-server; do
  cp "$WORK/build/bin/$t" "$PREFIX/bin/$t.tmp.$$"
  chmod +x "$PREFIX/bin/$t.tmp.$$"
  mv -f "$PREFIX/bin/$t.tmp.$$" "$PREFIX/bin/$t"
done
echo "$BIN"
