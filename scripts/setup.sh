#!/usr/bin/env bash
# Create .venv (if missing) and install what `rove demo` needs: rove with its `toolkit` extra at
# the versions of requirements/lock.txt (a pip constraint file: nothing unasked is installed).
# Idempotent and quick when done. ROVE_EXTRAS picks other extras (the library alone: ROVE_EXTRAS=
# with nothing after it); for development and tests: ./scripts/test.sh (the dev extra); for
# Hugging Face, lm-eval, FineWeb or Triton: .venv/bin/pip install -c requirements/lock.txt -e ".[hf]".
# It says in one line each what it does (the venv, the install, the lock); pip's own output only
# where pip fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
say() { echo "setup.sh: $*"; }
if [ -x .venv/bin/python ]; then
    say ".venv: present ($(.venv/bin/python -V 2>&1))"
else
    "$python" -m venv .venv
    say ".venv: created with $python ($(.venv/bin/python -V 2>&1))"
fi
# install EXTRAS (a pip extras list, possibly empty) unless the stamp is newer than its inputs
install() {
    local stamp=.venv/.rove-installed${1:+-$1} what="rove${1:+[$1]}"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ requirements/lock.txt -nt "$stamp" ]; then
        say "$what: installing (editable) at the versions of requirements/lock.txt ..."
        .venv/bin/python -m pip install -q --disable-pip-version-check \
            -c requirements/lock.txt -e ".${1:+[$1]}"
        touch "$stamp"
        say "$what: installed"
    else
        say "$what: already installed at the versions of requirements/lock.txt"
    fi
}
install "${ROVE_EXTRAS-toolkit}"
