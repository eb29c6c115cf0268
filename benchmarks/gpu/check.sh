#!/usr/bin/env bash
# On a machine with a CUDA GPU: the torch backend against issue 27's targets, as one table (at most 8 minutes
# on one H200 by default; see benchmarks/gpu/check.py). Installs nothing: the machine's own python3 with torch,
# transformers and pytest, the checkout on PYTHONPATH. Flags go to the check; exit 0 when every target holds.
#
#   benchmarks/gpu/check.sh                          # Llama-3-8B shapes, random weights, bfloat16
#   benchmarks/gpu/check.sh --max-seconds 300        # a shorter budget
#   PY=.venv/bin/python benchmarks/gpu/check.sh --device cpu --config tiny   # the same check on the CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
exec "$PY" -m benchmarks.gpu.check "$@"
