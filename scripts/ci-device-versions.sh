#!/usr/bin/env bash
# CI job on the GPU machine's versions, without a GPU: torch 2.11 and triton 3.6, as on the device
# image. It catches what the default job (newer torch, CPU) cannot: a dispatch path that torch
# 2.11's dynamo cannot trace whole, kernels that triton 3.6 will not compile for sm_90 (the
# H100/H200), a suite that does not import there.
#
# PyPI's torch 2.11 for Linux x86-64 is the CUDA build (with its nvidia-* libraries); without a
# GPU it runs on the CPU. Its venv, .venv-device, is made once and reused while the pins hold.
# Cost measured on the shared 2-core VM (busy): cold ~8 min (~5.5 of them the download and
# install of torch's CUDA libraries; the venv is 5.0 GB), warm (venv kept) ~3 min: the tests.
#
# Run: ./scripts/ci-device-versions.sh       (PYTHON=python3.12 to match the device's Python)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ROVE_DEVICE_VENV:-.venv-device}  # CI keeps it in a cache outside the checkout
PINS=(torch==2.11.0 triton==3.6.0)
STAMP="$VENV/rove-device-pins"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "${PINS[*]}" ]]; then
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  # rove's own dependencies from pyproject (editable, so the tests import this checkout)
  "$VENV/bin/pip" install --quiet "${PINS[@]}" -e . pytest hypothesis
  echo "${PINS[*]}" >"$STAMP"
fi

export PYTHONPATH="$PWD/src:$PWD/benchmarks"
"$VENV/bin/python" -c 'import torch, triton, gpu_suite; print("torch", torch.__version__, "triton", triton.__version__, "- suite imports")'
# fullgraph through the dispatch as on CUDA, graph sizes, the suite's stand-ins, sm_90 binaries,
# the compile tests of the torch path and the interpreted kernels
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_kernels_graphs.py tests/test_gpu_suite.py tests/test_kernels_compile.py \
  tests/test_kernels_torch.py tests/test_device_tracing.py tests/test_kernels_triton.py
