#!/usr/bin/env bash
# The device benchmarks in one go (under 8 minutes on one GPU): the backends table (Pyro against
# NumPyro on the same Seq2SeqAlignment, every method, two sizes) and the structured table (the
# Markov family's log p(y | x) four ways at T = S ∈ {8, 32, 128, 512}). Run from the
# repository root after README's install command:  bash benchmarks/gpu.sh [cuda|cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE="${1:-cuda}"
OUT="${OUT:-runs/gpu}"
mkdir -p "$OUT"
if [ "$DEVICE" != cpu ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/device.txt"
fi
timeout 240 python benchmarks/backends.py --reps 5 --device "$DEVICE" | tee "$OUT/backends.md"
timeout 240 python benchmarks/structured.py --reps 3 --timeout 60 --device "$DEVICE" \
    --json "$OUT/structured.json" | tee "$OUT/structured.md"
