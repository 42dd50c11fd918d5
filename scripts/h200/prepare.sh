#!/usr/bin/env bash
# Builds what the GPU check (check.sh) carries to a machine that cannot fetch crates: the
# release stallscope and stallgen, into .h200/bin (kept out of git). ARCH=aarch64 builds them
# for a Grace host (GH200, GB200/GB300) from this x86_64 machine: stallscope as released
# (`cargo xtask dist --target aarch64`), stallgen cross-built the same way (nightly
# -Zbuild-std, Debian's cross gcc). check.sh then runs unchanged on that host.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .h200/bin
case "${ARCH:-$(uname -m)}" in
  "$(uname -m)")
    cargo xtask build
    cp target/release/stallscope target/release/stallgen .h200/bin/
    ;;
  aarch64)
    cargo xtask dist --target aarch64
    tar -xzf dist/stallscope-*-aarch64-linux.tar.gz -O --wildcards '*/stallscope' >.h200/bin/stallscope
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      rustup run nightly cargo build --release --target aarch64-unknown-linux-gnu \
      -Zbuild-std=std,panic_abort -p stallgen
    cp target/aarch64-unknown-linux-gnu/release/stallgen .h200/bin/
    chmod +x .h200/bin/*
    ;;
  *)
    echo "prepare.sh: ARCH is x86_64 or aarch64" >&2
    exit 2
    ;;
esac
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qsx "/.h200/" "$exclude" || echo /.h200/ >>"$exclude"
ls -l .h200/bin
