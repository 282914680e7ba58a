#!/usr/bin/env bash
# The main demo on the embedded defaults (no broker needed): installs what the
# build needs when missing, then runs `highwater demo` with the given arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
exec cargo run --release -- demo "$@"
