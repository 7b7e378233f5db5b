#!/usr/bin/env bash
# Set up with the test tools (the dev extra, from the lock) if needed, lint, type-check src/, then
# run the fast test suite (slow and GPU tests: pytest -m slow / -m gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
ROVE_EXTRAS=dev ./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
