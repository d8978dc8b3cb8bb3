"""Where tritonserver is and what it needs around it: the binary in the nvidia-pytriton wheel, the
python backend stub, the stub's libpython and numpy, the environment variables and the ports.

Rules for the stub's environment (see docs/triton_2.51_notes.md, section 0 and Q6):
  * the python backend stub finds its interpreter through ``python3`` on PATH, so this
    interpreter's bin folder (the venv's) goes first on PATH (PYTHONPATH is ignored by the stub);
  * the stub links a libpython by soname; LD_LIBRARY_PATH gets a folder holding only a link to
    this interpreter's shared libpython (libpython_dir), so the stub does not mix a distro
    libpython with the venv's stdlib (which breaks ``import ssl`` inside models) and no other
    library of the interpreter's LIBDIR shadows those of the models' packages;
  * the stub therefore imports this environment's numpy, which must be numpy 1: with numpy 2 the
    2.51 stub aborts on the first BYTES input (check_numpy_for_stub).

Pure stdlib: importing this module never imports torch, numpy or tritonclient.
"""

from __future__ import annotations

import filecmp
import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002
STUB_NAME = "triton_python_backend_stub"


class LaunchError(RuntimeError):
    """tritonserver could not be started, died, or did not become ready in time."""


def python_version_tag() -> str:
    """``<major>.<minor>`` of this interpreter, e.g. "3.11" (names the stub and libpython)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pytriton_tritonserver_dir() -> Path:
    """``<site-packages>/pytriton/tritonserver`` of the installed nvidia-pytriton (not imported).
    Raises LaunchError when nvidia-pytriton is not installed or holds no tritonserver binary."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError(
            f"nvidia-pytriton is not installed for {sys.executable}; run scripts/setup.sh "
            "(or pip install nvidia-pytriton==0.7.0)"
        )
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "tritonserver"
        if (d / "bin" / "tritonserver").is_file():
            return d
    raise LaunchError(f"no tritonserver binary under {list(spec.submodule_search_locations)}")


def find_tritonserver() -> tuple[Path, Path]:
    """Return (tritonserver binary, backend directory) from the pytriton wheel (LaunchError as
    pytriton_tritonserver_dir)."""
    d = pytriton_tritonserver_dir()
    return d / "bin" / "tritonserver", d / "backends"


def ensure_python_stub(tritonserver_dir: Path | None = None) -> Path:
    """Copy the stub for this Python version into backends/python/ unless it is already there;
    returns its path. Raises LaunchError when the wheel has no stub for this Python."""
    d = tritonserver_dir or pytriton_tritonserver_dir()
    src = d / "python_backend_stubs" / python_version_tag() / STUB_NAME
    dst = d / "backends" / "python" / STUB_NAME
    if not src.is_file():
        raise LaunchError(
            f"the pytriton wheel has no python backend stub for Python {python_version_tag()} ({src} missing)"
        )
    if dst.is_file() and filecmp.cmp(src, dst, shallow=False):
        return dst
    tmp = dst.with_name(f".{STUB_NAME}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)  # atomic: concurrent launchers never see a half-written stub
    return dst


def python_bin_dir() -> str:
    """The folder whose ``python3`` the stub must find first on PATH (the venv's bin)."""
    prefix_bin = Path(sys.prefix) / "bin"
    if (prefix_bin / "python3").exists():
        return str(prefix_bin)
    return os.path.dirname(os.path.abspath(sys.executable))


def stub_numpy() -> tuple[str, str] | None:
    """(version, package folder) of the numpy installed for this interpreter, whose environment
    the python backend stub runs in (``python_bin_dir()`` is its bin); None without numpy.
    Read from the distribution's metadata: numpy is not imported."""
    try:
        dist = importlib.metadata.distribution("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version, str(dist.locate_file("numpy"))


def check_numpy_for_stub(version: str, location: str) -> None:
    """Raise LaunchError if numpy `version` (installed at `location`) is 2 or newer: Triton 2.51's
    python backend stub then aborts (``pybind11::error_already_set`` in deserialize_bytes_tensor)
    on the first BYTES input, and every request to that model fails with "Stub process '<model>'
    is not healthy"."""
    major = re.match(r"\d+", version)
    if major is None or int(major.group()) < 2:
        return
    raise LaunchError(
        f"numpy {version} is installed at {location}, and Triton 2.51's python backend stub cannot read "
        "BYTES tensors with numpy 2 (the stub aborts on the first string input; requests then fail with "
        "\"Stub process '<model>' is not healthy\"); install numpy 1 in this environment: "
        'pip install "numpy<2" (requirements.txt pins numpy==1.26.4)'
    )


def libpython_path() -> str | None:
    """This interpreter's shared libpython: a file in sysconfig LIBDIR, else in
    ``<sys.base_prefix>/lib`` (relocated builds such as python-build-standalone keep a LIBDIR
    from their build machine); None when neither holds one."""
    names = [
        f"libpython{python_version_tag()}.so.1.0",
        sysconfig.get_config_var("INSTSONAME"),
        sysconfig.get_config_var("LDLIBRARY"),
    ]
    for libdir in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib")):
        for name in names:
            if libdir and name and ".so" in name and os.path.isfile(os.path.join(libdir, name)):
                return os.path.join(libdir, name)
    return None


def libpython_dir(tritonserver_dir: Path | None = None) -> Path | None:
    """A folder holding one link, ``libpython<X.Y>.so.1.0`` (the soname the stub asks for) ->
    libpython_path(), for the stub's LD_LIBRARY_PATH; None without a shared libpython.

    Not LIBDIR itself: every library there would then outrank the RUNPATH of the libraries the
    stub loads later. Where LIBDIR is /usr/lib/x86_64-linux-gnu (Debian and Ubuntu Pythons), the
    PyTorch in the stub would load that folder's CUDA libraries instead of its own.
    """
    target = libpython_path()
    if target is None:
        return None
    folder = (tritonserver_dir or pytriton_tritonserver_dir()) / "python_lib" / python_version_tag()
    link = folder / f"libpython{python_version_tag()}.so.1.0"
    if not (link.is_symlink() and os.readlink(link) == target):
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".link.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)  # atomic: concurrent launchers never see a missing link
    return folder


def _prepend(path_list: Iterable[str], value: str | None) -> str:
    first = [p for p in path_list if p]
    rest = [p for p in (value or "").split(os.pathsep) if p and p not in first]
    return os.pathsep.join(first + rest)


def server_env(base: dict | None = None) -> dict:
    """Environment for tritonserver (``base``, default os.environ): venv bin first on PATH,
    libpython_dir() first on LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = _prepend([python_bin_dir()], env.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
    folder = libpython_dir()
    if folder is not None:
        env["LD_LIBRARY_PATH"] = _prepend([str(folder)], env.get("LD_LIBRARY_PATH"))
    return env


def nvidia_gpu_present(dev: str = "/dev") -> bool:
    """Whether an NVIDIA GPU device node (``<dev>/nvidia<N>``) exists. Without one, tritonserver's
    GPU start-up messages ("Failed to initialize NVML", "DCGM unable to start", ...) are expected.
    Read from the file system: neither CUDA nor NVML is loaded."""
    return any(re.fullmatch(r"nvidia\d+", entry.name) for entry in Path(dev).glob("nvidia*"))


def pick_free_ports(n: int = 3, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports that are free right now on host (held together while choosing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_ports_free(ports: Iterable[int], host: str) -> None:
    """Raise LaunchError naming the first of `ports` that is already in use on host."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # as servers do: connections in TIME_WAIT (e.g. of a server just stopped) do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                raise LaunchError(
                    f"port {port} on {host} is already in use (choose other ports or --free-ports)"
                ) from None
