#!/usr/bin/env bash
# Install what scripts/gpu_host_bundle.sh packed on a GPU host without internet, whose own python3
# holds PyTorch, transformers and safetensors. Run from this checkout's root, then set PYTHONPATH:
#
#   bash scripts/gpu_host_install.sh build/gpu_host_bundle.tar.xz [build/gpu_host_bundle_av.tar.xz]
#   export PYTHONPATH=/tmp/site
#
# It unpacks each archive into /tmp (their site/ folder: tritonserver, tritonclient, and PyAV
# when its archive is given), installs the bundle's numpy 1.26.4 into python3's own site-packages
# with pip (the 2.51 python backend stub needs numpy 1 and ignores PYTHONPATH; a wheel is rebuilt
# from the unpacked files: a copied tree left torch without numpy there, "Numpy is not available"),
# uninstalls scikit-learn and scipy (built for numpy 2; transformers imports them) and writes a
# .pth with this checkout's root into python3's site-packages (the stubs import h3_core from it).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu_host_install.sh BUNDLE.tar.xz [BUNDLE_av.tar.xz]" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rm -rf /tmp/site  # an older bundle's files would mix with these
for archive in "$@"; do tar -xJf "$archive" -C /tmp; done
PURELIB="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
INFO="$(ls -d /tmp/site/numpy-*.dist-info)"
TAG="$(grep -m1 '^Tag: ' "$INFO/WHEEL" | cut -d' ' -f2)"
VERSION="$(basename "$INFO" .dist-info | cut -d- -f2)"
WHEEL="/tmp/numpy-$VERSION-$TAG.whl"
(cd /tmp/site && python3 -m zipfile -c "$WHEEL" numpy "$(basename "$INFO")" numpy.libs)
python3 -m pip uninstall -q -y scikit-learn scipy 2>/dev/null || true
python3 -m pip install -q --no-index --no-deps --force-reinstall "$WHEEL"
echo "$ROOT" > "$PURELIB/h3_triton_repo.pth"
(cd / && env -u PYTHONPATH python3 -c "import numpy, torch; torch.zeros(1).numpy(); print('numpy', numpy.__version__, 'with torch', torch.__version__)")
