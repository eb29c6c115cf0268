#!/usr/bin/env bash
# On a machine with a CUDA GPU: the torch backend's logit-parity tests on CUDA (CUDA graphs
# captured), then the step benchmark on a Llama-3.2-1B-shaped model with random weights in
# bfloat16 (built from a config: nothing to download), printed as one table.
#
#   benchmarks/gpu_check.sh            # from the repository root, with the project's venv
#   PY=python CONFIG=llama-8b benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CONFIG=${CONFIG:-llama-1b}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check: this torch sees no CUDA device")'
echo "== parity tests on CUDA (float32, atol 2e-4)"
PREFILLBENCH_TEST_DEVICE=cuda "$PY" -m pytest -q tests/test_torch_backend.py tests/test_torch_linear.py
for graphs in "" "--no-cuda-graphs"; do
  echo "== step benchmark: $CONFIG, bfloat16, ${graphs:-CUDA graphs on}"
  "$PY" benchmarks/torch_steps.py --device cuda --dtype bfloat16 --config "$CONFIG" \
    --prompt 2048 --context 1024 --decodes 1,4,16,64 --chunk 512 -k 16 --ragged 300,700,1100,1500 --reps 10 $graphs
done
