#!/usr/bin/env bash
# perf_analyzer from the tritonclient 2.51 wheel, with the libcudart.so.12 of the
# nvidia-cuda-runtime-cu12 wheel on LD_LIBRARY_PATH (libb64.so.0d comes from Debian's
# libb64-0d, installed by scripts/setup.sh). Usage: scripts/perf_analyzer.sh <perf_analyzer args>
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
SP="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export LD_LIBRARY_PATH="$SP/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$VENV/bin/perf_analyzer" "$@"
