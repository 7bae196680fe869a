#!/usr/bin/env bash
# The GPU column of docs/results.md in one go (benchmarks/gpu.py: the backends table on the GPU
# and the CPU, the structured table at T = S in {128, 512, 2048}, compare on reorder with both
# backends; --write puts them into docs/results.md and sets the GPU rule of the monotonic
# chain's "auto" path). Run from the repository root after README's GPU set-up:
#   bash benchmarks/gpu.sh [--write] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv
exec python benchmarks/gpu.py "$@"
