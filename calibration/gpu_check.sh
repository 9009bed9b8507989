#!/usr/bin/env bash
# One prepared CUDA check for the device machine (run from the repository root there):
# the kernel harness for Llama-3.1-8B on the GPU, artifact and log written to $OUT.
# Sized to finish in a few minutes on an H200; pass another model/grid as arguments.
# Needs python3 with torch (the device image has it) plus kvsim's light dependencies
# (pydantic, numpy, scipy, pyyaml, click, rich); carry missing ones as wheels (.whl).
set -euo pipefail
OUT="${OUT:-/tmp/kvsim-gpu}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
MODEL="${1:-llama-3.1-8b}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -m kvsim calibrate kernels --model "$MODEL" --device cuda --layers 4 \
  --batches 1,4,16,64 --contexts 1024,8192,32768,131072 --prefill 256,1024,4096 \
  --repeats 5 -o "$OUT/cuda__$MODEL.json" 2>&1 | tee "$OUT/calibrate.log"
