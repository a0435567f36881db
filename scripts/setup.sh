#!/usr/bin/env bash
# Create .venv with shardlake and its test tooling, pinned by constraints.txt (CPU torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]" 2>&1 | grep -v "WARNING: Location" || true
.venv/bin/python -c "import shardlake, torch; assert '+cu' not in torch.__version__, torch.__version__"
