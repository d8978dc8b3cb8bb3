"""Start tritonserver (the 2.51 binary shipped in the nvidia-pytriton wheel) on a model repository.

CLI::

    python -m server.launch [--model-repository DIR] [--host ADDR]
                            [--http-port P] [--grpc-port P] [--metrics-port P] [--free-ports]
                            [--timeout SECONDS] [--log-file PATH] [--model-control {none,explicit}]
                            [--server-arg ARG]... [--quiet] [--supervise [--stale-after SECONDS]]
                            [--then CMD ARGS...]

Without ``--then`` the server runs in the foreground until SIGINT/SIGTERM (or until it dies;
with ``--supervise`` it is restarted instead, see ``TritonServer.failure``).
With ``--then`` the command runs once the server is ready, with ``H3_GRPC_URL``,
``H3_HTTP_URL`` and ``H3_METRICS_URL`` in its environment; the server is then stopped and the
launcher exits with the command's exit code.

Stopping drains first: the h3_dit stub gets SIGUSR1 and ends every request with a CANCELLED:
final response at its next step boundary, so tritonserver finds nothing in flight and exits at
once (otherwise it waits ``--exit-timeout-secs`` for the leaked ensemble requests and may crash).

Python API (used by the end-to-end tests)::

    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log") as srv:
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
        ...
    srv.log_text()

Environment rules (see docs/triton_2.51_notes.md, section 0 and Q6):
  * the python backend stub finds its interpreter through ``python3`` on PATH, so this
    interpreter's bin folder (the venv's) goes first on PATH (PYTHONPATH is ignored by the stub);
  * the stub links a libpython by soname; LD_LIBRARY_PATH gets a folder holding only a link to
    this interpreter's shared libpython (libpython_dir), so the stub does not mix a distro
    libpython with the venv's stdlib (which breaks ``import ssl`` inside models) and no other
    library of the interpreter's LIBDIR shadows those of the models' packages;
  * the stub therefore imports this environment's numpy, which must be numpy 1: with numpy 2 the
    2.51 stub aborts on the first BYTES input, so ``start()`` refuses (check_numpy_for_stub).

Pure stdlib: importing this module never imports torch or tritonclient.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import filecmp
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Iterable, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"
DEFAULT_HTTP_PORT, DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 8000, 8001, 8002
STUB_NAME = "triton_python_backend_stub"
DIT_MODEL = "h3_dit"  # the decoupled DiT: drained before a stop, watched by --supervise
DRAIN_TIMEOUT_S = 5.0  # longest wait for the DiT to end its requests before SIGTERM
SUPERVISE_INTERVAL_S = 1.0

__all__ = [
    "LaunchError",
    "TritonServer",
    "check_numpy_for_stub",
    "ensure_python_stub",
    "find_tritonserver",
    "main",
    "pick_free_ports",
    "server_env",
]


class LaunchError(RuntimeError):
    """tritonserver could not be started, died, or did not become ready in time."""


# --------------------------------------------------------------------------------------------
# Locating the server and preparing its environment
# --------------------------------------------------------------------------------------------

def python_version_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pytriton_tritonserver_dir() -> Path:
    """``<site-packages>/pytriton/tritonserver`` of the installed nvidia-pytriton (not imported)."""
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
    """Return (tritonserver binary, backend directory) from the pytriton wheel."""
    d = pytriton_tritonserver_dir()
    return d / "bin" / "tritonserver", d / "backends"


def ensure_python_stub(tritonserver_dir: Optional[Path] = None) -> Path:
    """Copy the stub for this Python version into backends/python/ unless it is already there."""
    d = tritonserver_dir or pytriton_tritonserver_dir()
    src = d / "python_backend_stubs" / python_version_tag() / STUB_NAME
    dst = d / "backends" / "python" / STUB_NAME
    if not src.is_file():
        raise LaunchError(f"the pytriton wheel has no python backend stub for Python "
                          f"{python_version_tag()} ({src} missing)")
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


def stub_numpy() -> Optional[tuple[str, str]]:
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
        "pip install \"numpy<2\" (requirements.txt pins numpy==1.26.4)"
    )


def libpython_path() -> Optional[str]:
    """This interpreter's shared libpython: a file in sysconfig LIBDIR, else in
    ``<sys.base_prefix>/lib`` (relocated builds such as python-build-standalone keep a LIBDIR
    from their build machine); None when neither holds one."""
    names = [f"libpython{python_version_tag()}.so.1.0", sysconfig.get_config_var("INSTSONAME"),
             sysconfig.get_config_var("LDLIBRARY")]
    for libdir in (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib")):
        for name in names:
            if libdir and name and ".so" in name and os.path.isfile(os.path.join(libdir, name)):
                return os.path.join(libdir, name)
    return None


def libpython_dir(tritonserver_dir: Optional[Path] = None) -> Optional[Path]:
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


def _prepend(path_list: Iterable[str], value: Optional[str]) -> str:
    first = [p for p in path_list if p]
    rest = [p for p in (value or "").split(os.pathsep) if p and p not in first]
    return os.pathsep.join(first + rest)


def server_env(base: Optional[dict] = None) -> dict:
    """Environment for tritonserver: venv bin first on PATH, libpython_dir() first on
    LD_LIBRARY_PATH."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = _prepend([python_bin_dir()], env.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
    folder = libpython_dir()
    if folder is not None:
        env["LD_LIBRARY_PATH"] = _prepend([str(folder)], env.get("LD_LIBRARY_PATH"))
    return env


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


def check_ports_free(ports, host: str) -> None:
    """Raise LaunchError naming the first of `ports` that is already in use on host."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # as servers do: connections in TIME_WAIT (e.g. of a server just stopped) do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                raise LaunchError(f"port {port} on {host} is already in use (choose other ports or --free-ports)") from None


def stub_pids(server_pid: int) -> dict[str, int]:
    """Model name -> pid of each python backend stub that is a child of ``server_pid`` (read
    from /proc; the stub's first argument is ``<repository>/<model>/<version>/model.py``)."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == server_pid and argv[0].endswith(STUB_NAME.encode()) and len(argv) > 1:
            pids[Path(argv[1].decode()).parents[1].name] = int(entry.name)
    return pids


def _connect_host(bind_host: str) -> str:
    if bind_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host == "::":
        return "[::1]"
    if ":" in bind_host and not bind_host.startswith("["):
        return f"[{bind_host}]"
    return bind_host


def _set_parent_death_signal() -> None:
    """Runs in the child between fork and exec: SIGTERM the server when the launcher dies, even by
    SIGKILL. Linux ties this to the *thread* that forked, so start servers from a long-lived
    thread (the main thread in the CLI and in pytest)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the launcher
    except Exception:
        pass


# Servers still running when the interpreter exits are stopped (no orphans from tests).
_LIVE: "weakref.WeakSet[TritonServer]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        try:
            srv.stop()
        except Exception:
            pass


_NOISE_LINE = re.compile(r"CudaDriverHelper|NVML|DCGM|unable to create stream")
_FAILURE_LINE = re.compile(
    r"failed to load|Failed to initialize|failed to start|error: creating server|already in use"
    r"|^E\d{4} ",
)


# --------------------------------------------------------------------------------------------
# The server object
# --------------------------------------------------------------------------------------------

class TritonServer:
    """A tritonserver process from the pytriton wheel; a context manager.

    Attributes once started: ``http_port``, ``grpc_port``, ``metrics_port``, ``grpc_url`` and
    ``http_url`` (``host:port``, the form tritonclient expects), ``metrics_url``
    (``http://host:port/metrics``), ``process`` (the Popen), ``pid``.
    """

    def __init__(
        self,
        model_repository: os.PathLike | str = DEFAULT_MODEL_REPOSITORY,
        *,
        host: str = "127.0.0.1",
        http_port: int = DEFAULT_HTTP_PORT,
        grpc_port: int = DEFAULT_GRPC_PORT,
        metrics_port: int = DEFAULT_METRICS_PORT,
        free_ports: bool = False,
        log_file: os.PathLike | str | None = None,
        model_control: str = "none",
        timeout: float = 120.0,
        exit_timeout_secs: int = 5,
        log_verbose: int = 0,
        extra_args: Sequence[str] = (),
        echo: bool = False,
        stop_grace: Optional[float] = None,
        max_log_lines: int = 20000,
    ) -> None:
        if model_control not in ("none", "explicit"):
            raise ValueError("model_control must be 'none' or 'explicit'")
        self.model_repository = Path(model_repository).resolve()
        self.host = host
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.free_ports = free_ports
        self.log_file = Path(log_file).resolve() if log_file else None
        self.model_control = model_control
        self.timeout = timeout
        self.exit_timeout_secs = int(exit_timeout_secs)
        self.log_verbose = int(log_verbose)
        self.extra_args = list(extra_args)
        self.echo = echo
        # SIGTERM -> wait this long -> SIGKILL the whole process group
        self.stop_grace = stop_grace if stop_grace is not None else self.exit_timeout_secs + 10.0
        self.process: Optional[subprocess.Popen] = None
        self._lines: collections.deque[str] = collections.deque(maxlen=max_log_lines)
        self._lock = threading.Lock()
        self._reader: Optional[threading.Thread] = None
        self._log_fh = None
        self.ready = False  # became ready since the last start
        self.dit_stub: Optional[int] = None  # pid of the h3_dit stub when the server became ready

    # ---- addresses ---------------------------------------------------------------------------
    @property
    def _chost(self) -> str:
        return _connect_host(self.host)

    @property
    def grpc_url(self) -> str:
        return f"{self._chost}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self._chost}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._chost}:{self.metrics_port}/metrics"

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def url_env(self) -> dict:
        return {"H3_GRPC_URL": self.grpc_url, "H3_HTTP_URL": self.http_url,
                "H3_METRICS_URL": self.metrics_url}

    def command(self) -> list[str]:
        binary, backends = find_tritonserver()
        cmd = [
            str(binary),
            "--model-repository", str(self.model_repository),
            "--disable-auto-complete-config",
            "--backend-directory", str(backends),
            "--http-address", self.host, "--http-port", str(self.http_port),
            "--grpc-address", self.host, "--grpc-port", str(self.grpc_port),
            "--metrics-address", self.host, "--metrics-port", str(self.metrics_port),
            "--model-control-mode", self.model_control,
            "--exit-timeout-secs", str(self.exit_timeout_secs),
            "--log-verbose", str(self.log_verbose),
        ]
        if self.model_control == "explicit":
            cmd.append("--load-model=*")  # same models as mode none, plus the load/unload API
        return cmd + self.extra_args

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: Optional[float] = None) -> "TritonServer":
        """Start the server and block until /v2/health/ready answers 200; LaunchError otherwise
        (at once when the stub's environment has numpy 2: see check_numpy_for_stub)."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise LaunchError(f"model repository {self.model_repository} is not a directory")
        numpy = stub_numpy()
        if numpy is not None:
            check_numpy_for_stub(*numpy)
        ensure_python_stub()
        attempts = 3 if self.free_ports else 1
        for attempt in range(attempts):
            if self.free_ports:
                self.http_port, self.grpc_port, self.metrics_port = pick_free_ports(3, self.host)
            else:  # a busy port would let the readiness check reach another server
                check_ports_free((self.http_port, self.grpc_port, self.metrics_port), self.host)
            try:
                self._spawn()
                self.wait_ready(self.timeout if timeout is None else timeout)
                return self
            except LaunchError:
                self.stop()
                if attempt + 1 < attempts and "already in use" in self.log_text():
                    continue  # lost a race for a "free" port: pick new ones
                raise
            except BaseException:  # KeyboardInterrupt, signal -> never leave the server behind
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        with self._lock:
            self._lines.clear()
        if self.log_file:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = open(self.log_file, "w", encoding="utf-8")
        self.process = subprocess.Popen(
            self.command(),
            env=server_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stubs are killed with it
            preexec_fn=_set_parent_death_signal,
        )
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._pump, args=(self.process,),
                                        name=f"tritonserver-log-{self.process.pid}", daemon=True)
        self._reader.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self._lines.append(line)
                if self._log_fh:
                    self._log_fh.write(line)
                    self._log_fh.flush()
            if self.echo:
                sys.stderr.write(line)
                sys.stderr.flush()
        proc.stdout.close()

    def _http(self, method: str, path: str, body: Optional[bytes] = None):
        url = f"http://{self._chost}:{self.http_port}{path}"
        req = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=2.0) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, OSError):
            return None, b""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        up_not_ready_since = None
        while True:
            rc = self.process.poll()
            if rc is not None:
                self._join_reader()
                raise LaunchError(self._failure(f"tritonserver exited with code {rc} "
                                                "before it became ready"))
            status, _ = self._http("GET", "/v2/health/ready")
            if status == 200:
                self.ready = True
                self.dit_stub = stub_pids(self.process.pid).get(DIT_MODEL)
                return
            now = time.monotonic()
            if status is not None:
                # In mode none the endpoints open only after every model was tried, so "up but
                # not ready" means a model failed (possible only with --exit-on-error=false).
                up_not_ready_since = up_not_ready_since or now
                if now - up_not_ready_since > 2.0:
                    bad = self._unavailable_models()
                    if bad:
                        raise LaunchError(self._failure("models failed to load: " + "; ".join(bad)))
            if now > deadline:
                raise LaunchError(self._failure(f"tritonserver not ready after {timeout:.0f} s"))
            time.sleep(0.1)

    def _unavailable_models(self) -> list[str]:
        status, body = self._http("POST", "/v2/repository/index", b"{}")
        if status != 200:
            return []
        try:
            index = json.loads(body)
        except ValueError:
            return []
        return [f"{m.get('name')}: {m.get('reason', '')}" for m in index
                if m.get("state") == "UNAVAILABLE"]

    def _failure(self, headline: str, tail: int = 40) -> str:
        lines = self.log_text().splitlines()
        key = [ln for ln in lines if _FAILURE_LINE.search(ln) and not _NOISE_LINE.search(ln)]
        parts = [f"{headline} (command: {' '.join(self.command())})"]
        if key:
            parts += ["--- errors from the server log ---", *list(dict.fromkeys(key))[:20]]
        parts += [f"--- last {min(tail, len(lines))} lines of the server log"
                  + (f" ({self.log_file})" if self.log_file else "") + " ---", *lines[-tail:]]
        return "\n".join(parts)

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the server process exits; return its exit code."""
        return self.process.wait(timeout)

    def h3_metrics(self) -> dict[str, float]:
        """The h3_* gauges and counters on /metrics (histograms left out) plus ``pending``:
        Triton's nv_inference_pending_request_count of h3_dit. {} if /metrics does not answer."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2.0) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError):
            return {}
        values = {}
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name.startswith("h3_") and not name.endswith(("_bucket", "_count", "_sum")):
                values[name] = float(line.rsplit(" ", 1)[1])
            elif name == "nv_inference_pending_request_count" and f'model="{DIT_MODEL}"' in line:
                values["pending"] = float(line.rsplit(" ", 1)[1])
        return values

    def drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Send SIGUSR1 to the h3_dit stub, which then ends every request with a CANCELLED:
        final response at its next step boundary and refuses newcomers with UNAVAILABLE:; wait
        up to ``timeout`` s until it reports no request and no step running. No-op when the
        repository has no h3_dit or its stub is gone."""
        if self.dit_stub is None or self.dit_stub != stub_pids(self.process.pid).get(DIT_MODEL):
            return
        os.kill(self.dit_stub, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.h3_metrics()
            if m and not (m.get("h3_active_requests") or m.get("h3_waiting_requests") or m.get("h3_execute_in_progress")):
                return
            time.sleep(0.05)

    def failure(self, stale_after: float) -> Optional[str]:
        """Why the server can no longer serve, or None. Measured on Triton 2.51: when the
        h3_dit stub dies, live and ready stay 200 and the stub is not restarted (the model is
        decoupled); every request then fails with "Stub process 'h3_dit_0_0' is not
        healthy.". A step stuck in Python is not noticed by Triton at all; it shows as a
        heartbeat (h3_heartbeat_timestamp_seconds) older than ``stale_after`` s while a step
        runs (h3_execute_in_progress) or requests wait in Triton's queue for h3_dit."""
        code = self.process.poll()
        if code is not None:
            return f"tritonserver exited with code {code}"
        if self.dit_stub is not None and stub_pids(self.process.pid).get(DIT_MODEL) != self.dit_stub:
            return f"the {DIT_MODEL} process (pid {self.dit_stub}) is gone"
        m = self.h3_metrics()
        age = time.time() - m.get("h3_heartbeat_timestamp_seconds", 0.0)
        if m.get("h3_heartbeat_timestamp_seconds") and age > stale_after and (m.get("h3_execute_in_progress") or m.get("pending")):
            return f"the {DIT_MODEL} heartbeat is {age:.0f} s old with work pending"
        return None

    def kill(self) -> Optional[int]:
        """Stop a broken server at once (no drain): SIGKILL its process group. Open streams
        end with gRPC UNAVAILABLE ("Stream removed")."""
        self.ready = False
        return self.stop(grace=0)

    def stop(self, grace: Optional[float] = None) -> Optional[int]:
        """Drain the DiT (see drain) if the server became ready, SIGTERM the server, wait up to
        ``grace`` s, then SIGKILL its process group."""
        proc = self.process
        if proc is None:
            return None
        grace = self.stop_grace if grace is None else grace
        if proc.poll() is None:
            if self.ready:
                self.drain()
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._kill_group(signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        self.ready = False
        self._reap_group(proc.pid)
        self._join_reader()
        with self._lock:
            if self._log_fh:
                self._log_fh.close()
                self._log_fh = None
        _LIVE.discard(self)
        return proc.returncode

    def _kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _reap_group(pgid: int, wait: float = 3.0) -> None:
        """Kill whatever is left in the server's process group (e.g. python backend stubs)."""
        deadline = time.monotonic() + wait
        sig = signal.SIGTERM
        while True:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            if time.monotonic() > deadline:
                return
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                return
            sig = signal.SIGKILL if time.monotonic() > deadline - wait / 2 else signal.SIGTERM
            time.sleep(0.05)

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(5.0)

    # ---- logs ------------------------------------------------------------------------------
    def log_text(self) -> str:
        """Everything the server printed (its last ``max_log_lines`` lines) since the last start."""
        with self._lock:
            return "".join(self._lines)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum, _frame):
    raise _Stop(signum)


def _say(msg: str) -> None:
    print(f"[server.launch] {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m server.launch",
        description="Run tritonserver (from the nvidia-pytriton wheel) on the model repository.")
    p.add_argument("--model-repository", default=str(DEFAULT_MODEL_REPOSITORY),
                   help="model repository (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the HTTP, gRPC and metrics endpoints bind to (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    p.add_argument("--free-ports", action="store_true", help="pick three free ports instead")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for /v2/health/ready (default: %(default)s)")
    p.add_argument("--log-file", help="also write the server log to this file")
    p.add_argument("--model-control", choices=("none", "explicit"), default="none",
                   help="'explicit' loads every model and opens the load/unload API to all clients")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra tritonserver argument (repeatable), e.g. --server-arg=--log-verbose=1")
    p.add_argument("--quiet", action="store_true",
                   help="do not echo the server log to stderr in foreground mode")
    p.add_argument("--supervise", action="store_true",
                   help="foreground mode: restart tritonserver (same ports) when it exits, when the "
                        "h3_dit process dies, or when the DiT's heartbeat is stale with work pending")
    p.add_argument("--stale-after", type=float, default=120.0, metavar="SECONDS",
                   help="--supervise: heartbeat age that counts as a stalled DiT; must exceed the "
                        "longest execute() (default: %(default)s)")
    p.add_argument("--then", nargs=argparse.REMAINDER, metavar="CMD",
                   help="once ready, run CMD with H3_GRPC_URL/H3_HTTP_URL/H3_METRICS_URL set, stop "
                        "the server and exit with CMD's exit code (must be the last option)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.then is not None and not args.then:
        _parser().error("--then needs a command")
    if args.supervise and args.then is not None:
        _parser().error("--supervise runs the server in the foreground; it cannot be combined with --then")
    server = TritonServer(
        args.model_repository, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, metrics_port=args.metrics_port, free_ports=args.free_ports,
        log_file=args.log_file, model_control=args.model_control, timeout=args.timeout,
        extra_args=args.server_arg, echo=(args.then is None and not args.quiet),
    )
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, _raise_stop) for s in handled}
    child: Optional[subprocess.Popen] = None
    rc = 1
    try:
        t0 = time.monotonic()
        server.start()
        _say(f"tritonserver ready in {time.monotonic() - t0:.1f} s (pid {server.pid}): "
             f"grpc={server.grpc_url} http={server.http_url} metrics={server.metrics_url}")
        if args.then:
            env = dict(os.environ, **server.url_env())
            _say(f"running: {shlex.join(args.then)}")
            child = subprocess.Popen(args.then, env=env)
            rc = child.wait()
            rc = 128 - rc if rc < 0 else rc
        else:
            _say("serving; Ctrl-C or SIGTERM stops it")
            while args.supervise:
                reason = server.failure(args.stale_after)
                if reason is None:
                    time.sleep(SUPERVISE_INTERVAL_S)
                    continue
                _say(f"{reason}: restarting tritonserver")
                server.kill()
                server.free_ports = False  # clients reconnect to the same ports
                t0 = time.monotonic()
                server.start()
                _say(f"tritonserver ready again in {time.monotonic() - t0:.1f} s (pid {server.pid})")
            code = server.wait()
            if code != 0:
                _say("tritonserver died with exit code {}:\n{}".format(
                    code, "\n".join(server.log_text().splitlines()[-40:])))
            rc = code if code > 0 else (128 - code if code < 0 else 1)
    except _Stop as stop:
        _say(f"got signal {signal.Signals(stop.signum).name}, stopping")
        rc = 128 + stop.signum
    except LaunchError as e:
        _say(str(e))
        rc = 1
    except FileNotFoundError as e:  # --then command not found
        _say(f"cannot run {args.then}: {e}")
        rc = 127
    finally:
        for s in handled:  # cleanup is bounded (grace periods); don't let a 2nd Ctrl-C cut it short
            signal.signal(s, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if server.is_running():
            _say("stopping tritonserver")
        code = server.stop()
        if code is not None and args.then is None and rc >= 128:
            _say(f"tritonserver stopped (exit code {code})")
        for s, h in previous.items():
            signal.signal(s, h)
    return rc


if __name__ == "__main__":
    sys.exit(main())
