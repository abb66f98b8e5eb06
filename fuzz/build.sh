#!/usr/bin/env bash
# Builds every fuzz target on a stable toolchain (cargo-fuzz needs nightly-only flags, which
# RUSTC_BOOTSTRAP=1 unlocks). Needs cargo-fuzz: `cargo install cargo-fuzz`.
# Run one with: RUSTC_BOOTSTRAP=1 cargo fuzz run packet -- -max_total_time=180
set -euo pipefail
cd "$(dirname "$0")" && RUSTC_BOOTSTRAP=1 cargo fuzz build -O "$@"
