#!/usr/bin/env bash
# Create .venv (if missing) and install what `rove demo` needs: rove with its `toolkit` extra at
# the versions of requirements/lock.txt (a pip constraint file: nothing unasked is installed).
# Idempotent and quick when done. ROVE_EXTRAS picks other extras (the library alone: ROVE_EXTRAS=
# with nothing after it); for development and tests: ./scripts/test.sh (the dev extra); for
# Hugging Face, lm-eval, FineWeb or Triton: .venv/bin/pip install -c requirements/lock.txt -e ".[hf]".
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# install EXTRAS (a pip extras list, possibly empty) unless the stamp is newer than its inputs
install() {
    local stamp=.venv/.rove-installed${1:+-$1}
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements/lock.txt -nt "$stamp" ]; then
        .venv/bin/python -m pip install -q --disable-pip-version-check \
            -c requirements/lock.txt -e ".${1:+[$1]}"
        touch "$stamp"
    fi
}
install "${ROVE_EXTRAS-toolkit}"
