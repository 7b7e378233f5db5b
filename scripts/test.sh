#!/usr/bin/env bash
# Set up if needed, lint, type-check src/, then run the fast test suite (slow and GPU tests: pytest -m slow / -m gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
