#!/usr/bin/env bash
# The demo: synthetic driving frames -> pack -> version -> load (pass --store s3 for loopback S3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/shardlake demo "$@"
