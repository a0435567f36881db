#!/usr/bin/env bash
# The whole test suite: lint, types, layers, API docs, unit tests, conformance (local, memory,
# S3 on moto and SeaweedFS, GCS, Azure on Azurite), DDP.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests conformance benchmarks examples
.venv/bin/ruff format --check src tests conformance benchmarks examples
.venv/bin/mypy
# The layer order of docs/architecture.md (no layer imports a higher one).
.venv/bin/lint-imports --no-cache
# The API reference must build without warnings (a missing or broken reference fails here);
# no --quiet: it would hide griffe's docstring warnings, which --strict then does not count.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site_dir"
rm -rf "$site_dir"
# Two processes (the CI machine has 2 cores); a file stays in one process (its servers, clusters).
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
