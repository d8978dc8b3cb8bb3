#!/usr/bin/env bash
# Pack what a GPU host without internet needs, beyond its own PyTorch, to run the served
# benchmarks (benchmarks/served_bench.py): tritonserver 2.51 from this .venv's nvidia-pytriton
# (binary, backends, the python backend stub for the host's Python, bundled libraries except
# pytriton's libpython 3.13), the tritonclient Python package (perf_analyzer binaries left out),
# python-rapidjson (this .venv's version) and numpy 1.26.4 (the 2.51 stub cannot read BYTES tensors
# with numpy 2; server.launch refuses it), wheels for the host's Python, unpacked: about 40 MB as
# tar.xz. PyAV (this .venv's version; its wheel brings its FFmpeg libraries) goes into a second
# archive beside it, OUT with _av before .tar.xz (about 30 MB), which unpacks into the same site
# folder: with it h3_vae encodes MP4 on the GPU host, so served benchmarks return what users get.
# Two archives, so that each travels where a transfer is limited to 64 MiB.
#
#   bash scripts/gpu_host_bundle.sh [OUT.tar.xz] [PYTHON_VERSION]     (defaults: build/gpu_host_bundle.tar.xz 3.12)
#
# On the host, in the checkout: bash scripts/gpu_host_install.sh OUT.tar.xz [OUT_av.tar.xz], then
# export PYTHONPATH=/tmp/site. The stub embeds the host's libpython (libpython3.12.so.1.0 must be
# on the loader path) and runs the models with the python3 first on PATH, whose site-packages must
# hold torch, safetensors and transformers; the install script puts numpy 1 and a .pth with this
# repository's root there (see docs/gpu_host.md §"A GPU host without internet").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(realpath -m "${1:-$ROOT/build/gpu_host_bundle.tar.xz}")"
PYV="${2:-3.12}"
VPY="$ROOT/.venv/bin/python"
SP="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
T="$SP/pytriton/tritonserver"
[ -x "$T/bin/tritonserver" ] || { echo "no tritonserver under $T: run scripts/setup.sh first" >&2; exit 1; }
[ -f "$T/python_backend_stubs/$PYV/triton_python_backend_stub" ] || {
    echo "nvidia-pytriton has no python backend stub for Python $PYV" >&2; exit 1; }

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
S="$STAGE/site"
mkdir -p "$S/pytriton/tritonserver/python_backend_stubs" "$S/nvidia_pytriton.libs"
cp -r "$T/bin" "$T/backends" "$T/caches" "$S/pytriton/tritonserver/"
cp -r "$T/python_backend_stubs/$PYV" "$S/pytriton/tritonserver/python_backend_stubs/"
cp "$SP"/nvidia_pytriton.libs/* "$S/nvidia_pytriton.libs/"
rm -f "$S"/nvidia_pytriton.libs/libpython3*  # the 3.13 stub's; the host's own libpython is used
cp -r "$SP/tritonclient" "$SP/prometheus_client" "$S/"
rm -rf "$S/tritonclient/bin"
RAPIDJSON="$("$VPY" -c 'import importlib.metadata as m; print(m.version("python-rapidjson"))')"
AV="$("$VPY" -c 'import importlib.metadata as m; print(m.version("av"))')"
NUMPY=1.26.4  # the last numpy 1 with wheels for Python 3.12
"$VPY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$STAGE/wheels" \
    "python-rapidjson==$RAPIDJSON" "numpy==$NUMPY" "av==$AV" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
AV_OUT="${OUT%.tar.xz}_av.tar.xz"
mkdir -p "$STAGE/av/site" "$(dirname "$OUT")"
for wheel in "$STAGE"/wheels/python_rapidjson-*.whl "$STAGE"/wheels/numpy-*.whl; do "$VPY" -m zipfile -e "$wheel" "$S"; done
"$VPY" -m zipfile -e "$STAGE"/wheels/av-*.whl "$STAGE/av/site"
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$STAGE" -cJf "$OUT" site
tar -C "$STAGE/av" -cJf "$AV_OUT" site
echo "wrote $OUT ($(du -h "$OUT" | cut -f1)): tritonserver + python $PYV stub, tritonclient, python-rapidjson $RAPIDJSON, numpy $NUMPY"
echo "wrote $AV_OUT ($(du -h "$AV_OUT" | cut -f1)): av $AV"
