#!/usr/bin/env bash
# Create .venv (if missing) and install rove with its test tools. Idempotent and quick when done.
# On a machine without an NVIDIA driver, torch is pinned to the CPU wheel (requirements/cpu.txt):
# an unpinned torch would pull a multi-GB CUDA build. With a driver, pip picks the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
constraint=()
command -v nvidia-smi >/dev/null 2>&1 || constraint=(-c requirements/cpu.txt)
stamp=.venv/.rove-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements/cpu.txt -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "${constraint[@]}" -e ".[dev]"
    touch "$stamp"
fi
