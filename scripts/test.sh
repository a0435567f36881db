#!/usr/bin/env bash
# The whole test suite: lint, types, unit tests, conformance (local, memory, S3, GCS), DDP.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests conformance benchmarks examples
.venv/bin/ruff format --check src tests conformance benchmarks examples
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
