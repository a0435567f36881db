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
# Azurite (Azure Blob emulator, npm) for the Azure tests, pinned by scripts/azurite/package-lock.json
# and installed into .cache/azurite; reinstalled only when the lock file changes.
if command -v npm >/dev/null 2>&1; then
  az_dir=.cache/azurite
  if [ ! -x "$az_dir/node_modules/.bin/azurite-blob" ] \
     || ! cmp -s scripts/azurite/package-lock.json "$az_dir/package-lock.json"; then
    mkdir -p "$az_dir"
    cp scripts/azurite/package.json scripts/azurite/package-lock.json "$az_dir/"
    npm ci --prefix "$az_dir" --no-audit --no-fund --loglevel=error >/dev/null
  fi
else
  echo "setup.sh: npm not found - the Azure (Azurite) tests will not be able to start their server" >&2
fi
