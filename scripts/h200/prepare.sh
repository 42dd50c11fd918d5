#!/usr/bin/env bash
# Builds what the H200 check (check.sh) carries to a machine that cannot fetch crates:
# the release stallscope and stallgen, into .h200/bin (kept out of git).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo xtask build
mkdir -p .h200/bin
cp target/release/stallscope target/release/stallgen .h200/bin/
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qsx "/.h200/" "$exclude" || echo /.h200/ >>"$exclude"
ls -l .h200/bin
