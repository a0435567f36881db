#!/usr/bin/env bash
# The demo: synthetic driving frames -> pack -> version -> load (pass --store s3 for loopback S3).
# Installs only what the demo needs, the `demo` extra (shardlake, s3fs, CPU torch, moto's S3
# server), pinned by constraints.txt; scripts/setup.sh (run by scripts/test.sh) installs the test
# tooling on top. What this script does goes to stderr, so `--json` output stays clean.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf 'demo.sh [%3ds]: %s\n' "$SECONDS" "$*" >&2; }

if [ ! -x .venv/bin/python ]; then
  say "creating the virtualenv .venv ($("$PY" --version 2>&1))"
  "$PY" -m venv .venv
fi
# Already set up (by an earlier run or by scripts/setup.sh) for this checkout: start at once.
if .venv/bin/python - "$PWD/src" >/dev/null 2>&1 <<'EOF'
import os, sys
import moto.server, s3fs, torch, torchdata  # noqa: F401
import shardlake
here = os.path.realpath(sys.argv[1]) + os.sep  # this checkout's sources, not another's
assert os.path.realpath(shardlake.__file__).startswith(here), shardlake.__file__
EOF
then
  say ".venv already has shardlake[demo]"
else
  say "installing shardlake[demo] into .venv: shardlake, s3fs, CPU torch, moto's S3 server (pinned by constraints.txt)"
  log=.venv/demo-install.log
  PIP_LINES='^(Collecting|Installing collected|Successfully)'
  # pip's own lines, cut to one per package fetched and the final summary.
  # --no-compile: byte-compiling every module of torch was ~40% of the install's CPU time;
  # Python compiles what the demo imports on first use.
  if ! .venv/bin/python -m pip install --disable-pip-version-check --no-compile \
      -c constraints.txt -e ".[demo]" >"$log" 2>&1 < /dev/null; then
    say "pip failed; the end of $log:"
    tail -n 30 "$log" >&2
    exit 1
  fi &
  pip_pid=$!
  shown=0
  show_new() {  # pip's progress lines not shown yet
    local lines
    lines=$(grep -cE "$PIP_LINES" "$log" 2>/dev/null || true)
    if [ "${lines:-0}" -gt "$shown" ]; then
      grep -E "$PIP_LINES" "$log" | sed -n "$((shown + 1)),${lines}p" | cut -c1-110 \
        | sed 's/^/  pip: /' >&2
      shown=$lines
    fi
  }
  while kill -0 "$pip_pid" 2>/dev/null; do
    sleep 2
    show_new
  done
  wait "$pip_pid"
  show_new
  .venv/bin/python -c "import torch; assert '+cu' not in torch.__version__, torch.__version__"
  say "installed"
fi
say "running: shardlake demo $*"
.venv/bin/shardlake demo "$@"
