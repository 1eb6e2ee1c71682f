#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh), configures and builds troupe.
# Usage: scripts/build.sh [ninja targets...]   (build dir: $TROUPE_BUILD_DIR or ./build)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TROUPE_BUILD_DIR:-$root/build}
jobs=${TROUPE_JOBS:-$(nproc)}

bash "$root/scripts/setup.sh" >&2
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >&2
fi
ninja -C "$build" -j "$jobs" "$@" >&2
