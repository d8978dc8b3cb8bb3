#!/usr/bin/env bash
# Idempotent set-up of the h3-triton environment; run from anywhere (make setup).
#   1. .venv/ in the repo root, made with the system python3 ($PYTHON overrides); recreated if broken
#   2. torch==2.13.0 first, then requirements.txt, then this project editable (h3_core, server,
#      client importable everywhere, also inside the python backend stub); skipped while
#      .venv/.requirements.sha256 matches requirements.txt + pyproject.toml
#   3. Debian libb64-0d for perf_analyzer, chromium + chromium-driver for the page test, prometheus
#      (promtool) for the deploy/k8s tests (apt-get, only if missing; sudo only when not root)
#   4. the python backend stub for the venv's Python copied into pytriton's backends/python/
#   5. python -m h3_core.weights.checkpoint_setup (seeded weights under checkpoints/), if that module exists
#   6. nodejs + npm (apt), then `npm ci` in tests/js: the official openai JS SDK and esbuild at the
#      versions tests/js/package-lock.json pins, for the cross-origin browser test; skipped while
#      tests/js/node_modules/.lock.sha256 matches the lock file
# Downloads only from the configured PyPI index, Debian apt and the npm registry (tests/js only).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.requirements.sha256"
TORCH_PIN="torch==2.13.0"
START=$SECONDS

# every line says how many seconds set-up has run
log() { printf '[setup %3d s] %s\n' "$((SECONDS - START))" "$*"; }
warn() { printf '[setup %3d s] WARNING: %s\n' "$((SECONDS - START))" "$*" >&2; }
pyver() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
# pip, logging each package as it is collected and the install step, minus the machine config's
# "file:///opt/pypi.../x is ignored" noise (pip's exit status kept: pipefail)
pip_install() {
    "$VPY" -m pip install --progress-bar off "$@" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) |
        while IFS= read -r line; do
            case "$line" in
                Collecting*) log "  pip: ${line#Collecting }" ;;
                "Installing collected packages: "*)
                    log "  pip: installing $(($(tr -cd , <<< "$line" | wc -c) + 1)) packages" ;;
                "Successfully installed "*) log "  pip: installed" ;;
            esac
        done
}

# ---- 1. virtual environment ------------------------------------------------------------------
SYS_VER="$(pyver "$PYTHON")"
venv_ok() {
    [ -x "$VPY" ] && "$VPY" -c 'import pip' >/dev/null 2>&1 && [ "$(pyver "$VPY")" = "$SYS_VER" ]
}
if [ -e "$VENV" ] && ! venv_ok; then
    warn ".venv is broken or not Python $SYS_VER; recreating it"
    rm -rf "$VENV"
fi
if [ ! -e "$VENV" ]; then
    log "creating .venv with $(command -v "$PYTHON") (Python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
    "$PYTHON" -m venv "$VENV"
else
    log ".venv ok (Python $(pyver "$VPY"))"
fi

# ---- 2. Python packages ----------------------------------------------------------------------
WANT="$( { echo "$TORCH_PIN"; cat requirements.txt; cat pyproject.toml 2>/dev/null || true; echo "$ROOT"
          "$VPY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
tritonserver_dir() {
    "$VPY" -c 'import importlib.util as u, os; s = u.find_spec("pytriton"); print(os.path.join(list(s.submodule_search_locations)[0], "tritonserver"))' 2>/dev/null
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && T="$(tritonserver_dir)" && [ -x "$T/bin/tritonserver" ]; then
    log "requirements.txt and pyproject.toml unchanged since the last install; skipping pip"
else
    log "pip install $TORCH_PIN"
    pip_install "$TORCH_PIN"
    log "pip install -r requirements.txt"
    pip_install -r requirements.txt
    if [ -f pyproject.toml ]; then
        # compat mode = a .pth with the repo root, so packages added later are importable too
        log "pip install -e . (editable, compat mode)"
        pip_install --no-deps -e . --config-settings editable_mode=compat
        rm -rf "$ROOT/h3_triton.egg-info"  # build leftover; the metadata lives in site-packages
    fi
    echo "$WANT" > "$STAMP"
    log "packages installed ($("$VPY" -c 'import torch; print("torch", torch.__version__)'))"
fi

# ---- 3. Debian packages (apt-get, only those missing; sudo only when not root) ----------------
#   libb64-0d: perf_analyzer from the tritonclient wheel links libb64.so.0d
#   chromium + chromium-driver: the Videos API page's test drives them through Selenium
#   prometheus: promtool and prometheus for the checks of deploy/k8s's rules and dashboard
apt_ensure() {  # apt_ensure "what needs them" PACKAGE...
    local why="$1" package missing=() SUDO=()
    shift
    if ! command -v dpkg-query >/dev/null 2>&1; then
        warn "not a Debian system: install $* yourself ($why)"
        return
    fi
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        log "$* already installed"
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then SUDO=(sudo); fi
    export DEBIAN_FRONTEND=noninteractive
    log "apt-get install ${missing[*]}"
    if "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
        || { "${SUDO[@]}" apt-get update -q >/dev/null && "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }; then
        log "${missing[*]} installed"
    else
        warn "could not install ${missing[*]}: $why"
    fi
}
apt_ensure "perf_analyzer will not run (the server and tests do not need it)" libb64-0d
apt_ensure "tests/test_videos_page.py will fail (it needs a headless browser)" chromium chromium-driver
apt_ensure "tests/test_prometheus.py will fail (it needs promtool and prometheus)" prometheus
apt_ensure "tests/test_videos_api_browser.py will fail (it bundles the openai JS SDK with node)" nodejs npm

# ---- 4. python backend stub for this Python --------------------------------------------------
T="$(tritonserver_dir)"
PYV="$(pyver "$VPY")"
SRC="$T/python_backend_stubs/$PYV/triton_python_backend_stub"
DST="$T/backends/python/triton_python_backend_stub"
if [ ! -f "$SRC" ]; then
    echo "[setup] ERROR: nvidia-pytriton has no python backend stub for Python $PYV ($SRC)" >&2
    exit 1
elif cmp -s "$SRC" "$DST"; then
    log "python backend stub for $PYV already in place"
else
    cp "$SRC" "$DST.tmp.$$" && mv -f "$DST.tmp.$$" "$DST"
    log "copied the python backend stub for $PYV into $T/backends/python/"
fi

# ---- 5. seeded weights -----------------------------------------------------------------------
if [ -f h3_core/weights/checkpoint_setup.py ] || [ -f h3_core/weights/checkpoint_setup/__main__.py ]; then
    log "python -m h3_core.weights.checkpoint_setup"
    "$VPY" -m h3_core.weights.checkpoint_setup
else
    log "h3_core.weights.checkpoint_setup does not exist yet; skipping the weights step"
fi

# ---- 6. the JS SDK for the browser test (npm ci: exactly the lock file's versions) --------------
JS_STAMP="$ROOT/tests/js/node_modules/.lock.sha256"
JS_WANT="$(sha256sum "$ROOT/tests/js/package-lock.json" | cut -d' ' -f1)"
if ! command -v npm >/dev/null 2>&1; then
    warn "npm is missing: tests/test_videos_api_browser.py will fail (apt-get install nodejs npm)"
elif [ -f "$JS_STAMP" ] && [ "$(cat "$JS_STAMP")" = "$JS_WANT" ]; then
    log "tests/js/package-lock.json unchanged since the last npm ci; skipping npm"
else
    log "npm ci in tests/js (openai JS SDK, esbuild)"
    (cd "$ROOT/tests/js" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$JS_WANT" > "$JS_STAMP"
    log "tests/js/node_modules installed"
fi

log "done in $((SECONDS - START)) s"
