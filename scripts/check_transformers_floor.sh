#!/usr/bin/env bash
# Do rove's Hugging Face folders load under the lowest transformers the [hf] extra allows?
#
#   scripts/check_transformers_floor.sh [DEV_PYTHON]
#
# DEV_PYTHON (default .venv/bin/python): the development environment, with torch and a current
# transformers; it writes exports and a saved converted model (scripts/check_transformers_floor.py
# write). A second environment, $ROVE_FLOOR_VENV (default .venv-floor, git-ignored, cached),
# holds transformers at pyproject's floor with the tokenizers and huggingface_hub it needs, and
# borrows torch and the rest from DEV_PYTHON's site-packages (listed after its own, so its pins
# win); it loads every folder with stock AutoModelForCausalLM / AutoTokenizer and compares
# logits, token ids, left padding and batched generation (... check), then runs the tests of
# exports, generation and HF models in rove's loop under it. Exit 0 when all agree.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV_PYTHON=${1:-.venv/bin/python}
VENV=${ROVE_FLOOR_VENV:-.venv-floor}
FLOOR=$(sed -n 's/^hf = \["transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$FLOOR" ] || { echo "check_transformers_floor: no transformers floor in pyproject.toml" >&2; exit 2; }
# transformers $FLOOR's own bounds: tokenizers >=0.22,<=0.23.0, huggingface_hub >=0.34,<1.0
PINS=("transformers==$FLOOR" "tokenizers==0.22.1" "huggingface_hub==0.36.0")
STAMP="$VENV/.rove-floor-${PINS[*]// /_}"
if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    BASE=$("$DEV_PYTHON" -c 'import sys; print(sys.base_prefix)')/bin/python3
    "$BASE" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "${PINS[@]}"
    touch "$STAMP"
fi
# torch, numpy, safetensors ... from the development environment, after the pinned packages
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$DEV_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/zz-rove-dev.pth"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HF_MODULES_CACHE="$WORK/modules"
"$DEV_PYTHON" scripts/check_transformers_floor.py write "$WORK"
"$VENV/bin/python" scripts/check_transformers_floor.py check "$WORK" < /dev/null
# and what rove does with transformers itself (exports, generation, HF models in rove's loop),
# run by the floor (pytest from DEV_PYTHON's site-packages)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_hf_export.py tests/test_generate.py \
    tests/test_hf_causal_lm.py tests/test_finetune_hf.py tests/test_finetune_scaling.py \
    tests/test_hf_fraction.py tests/test_finetune_lora.py tests/test_hf_peft.py tests/test_hf_transfer.py
