"""The tritonserver process: start, wait until ready, drain, stop, supervise, read its metrics.

    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log") as srv:
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
        ...
    srv.log_text()

Stopping drains first: the h3_dit stub gets SIGUSR1 and ends every request with a CANCELLED:
final response at its next step boundary, so tritonserver finds nothing in flight and exits at
once (otherwise it waits ``--exit-timeout-secs`` for the leaked ensemble requests and may crash).
The environment the server runs in comes from server.environment; the CLI is server.launch;
reading its /metrics page is server.metrics (metric_samples, read_metrics, dit_stall).

Without an NVIDIA GPU, tritonserver logs GPU start-up failures (NVML, DCGM, the CUDA driver,
pinned memory) that are expected there: an echoing server leaves them out of the echo and says
so once (GPU_NOISE_NOTE); its log keeps them.

Importing this module never imports torch or tritonclient.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path

from .environment import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_MODEL_REPOSITORY,
    LaunchError,
    check_numpy_for_stub,
    check_ports_free,
    ensure_python_stub,
    find_tritonserver,
    nvidia_gpu_present,
    pick_free_ports,
    server_env,
    stub_numpy,
)
from .metrics import HISTOGRAM_SUFFIXES, dit_stall, metric_samples, read_metrics
from .stubs import DIT_MODEL, dit_stubs, gone_stub, stub_pids

DRAIN_TIMEOUT_S = 5.0  # longest wait for the DiT to end its requests before SIGTERM
# After the DiT drained, a stop waits for h3_vae's open decodes (results denoised before the stop)
# for as long as they progress: it gives up only when no decode finished and none left the backlog
# for this long (a stalled decode; the longest measured, 256 x 256 x 121 frames on 2 busy CPU
# cores, took 11 s).
DECODE_STALL_S = 120.0
DEFAULT_STALE_AFTER_S = 120.0  # heartbeat age that counts as a stalled DiT (launcher --supervise, health check)
# tritonserver's start-up messages about a GPU it cannot use: expected on a machine without one
GPU_NOISE_LINE = re.compile(
    r"CudaDriverHelper|NVML|DCGM|unable to create stream|pinned memory pool will not"
    r"|CUDA memory pool disabled"
)
GPU_NOISE_NOTE = (
    "[server.launch] no NVIDIA GPU on this machine: tritonserver's GPU messages (NVML, DCGM, "
    "CUDA driver, pinned memory) are expected and left out of this echo; the server log keeps them\n"
)
_FAILURE_LINE = re.compile(
    r"failed to load|Failed to initialize|failed to start|error: creating server|already in use"
    r"|^E\d{4} ",
)


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
_LIVE: weakref.WeakSet[TritonServer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        try:
            srv.stop()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# The server object
# --------------------------------------------------------------------------------------------


class TritonServer:
    """A tritonserver process from the pytriton wheel; a context manager.

    Attributes once started: ``http_port``, ``grpc_port``, ``metrics_port``, ``grpc_url`` and
    ``http_url`` (``host:port``, the form tritonclient expects), ``metrics_url``
    (``http://host:port/metrics``), ``process`` (the Popen), ``pid``. With ``echo`` the server's
    log goes to stderr as it comes, without the GPU_NOISE_LINE lines where no NVIDIA GPU is.
    Raises ValueError for a model_control other than "none" or "explicit".
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
        stop_grace: float | None = None,
        max_log_lines: int = 20000,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
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
        self.drain_timeout_s = float(drain_timeout_s)
        self.log_verbose = int(log_verbose)
        self.extra_args = list(extra_args)
        self.echo = echo
        # SIGTERM -> wait this long -> SIGKILL the whole process group
        self.stop_grace = stop_grace if stop_grace is not None else self.exit_timeout_secs + 10.0
        self.process: subprocess.Popen | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=max_log_lines)
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._log_fh = None
        self.ready = False  # became ready since the last start
        self.dit_stubs: list[int] = []  # pids of the h3_dit stubs when the server became ready
        self.stubs: dict[int, str] = {}  # pid -> instance of every model's stub then
        self._gpu_noise_explained = False  # GPU_NOISE_NOTE was echoed

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
    def pid(self) -> int | None:
        """The tritonserver process id once started, else None."""
        return self.process.pid if self.process else None

    def is_running(self) -> bool:
        """Whether the tritonserver process was started and has not exited."""
        return self.process is not None and self.process.poll() is None

    def url_env(self) -> dict:
        """H3_GRPC_URL, H3_HTTP_URL and H3_METRICS_URL of this server (what ``--then`` commands get)."""
        return {"H3_GRPC_URL": self.grpc_url, "H3_HTTP_URL": self.http_url, "H3_METRICS_URL": self.metrics_url}

    def command(self) -> list[str]:
        """The tritonserver command line for the current ports (LaunchError without the pytriton wheel)."""
        binary, backends = find_tritonserver()
        cmd = [
            str(binary),
            "--model-repository",
            str(self.model_repository),
            "--disable-auto-complete-config",
            "--backend-directory",
            str(backends),
            "--http-address",
            self.host,
            "--http-port",
            str(self.http_port),
            "--grpc-address",
            self.host,
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-address",
            self.host,
            "--metrics-port",
            str(self.metrics_port),
            "--model-control-mode",
            self.model_control,
            "--exit-timeout-secs",
            str(self.exit_timeout_secs),
            "--log-verbose",
            str(self.log_verbose),
        ]
        if self.model_control == "explicit":
            cmd.append("--load-model=*")  # same models as mode none, plus the load/unload API
        return cmd + self.extra_args

    # ---- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float | None = None) -> TritonServer:
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
        self._reader = threading.Thread(
            target=self._pump, args=(self.process,), name=f"tritonserver-log-{self.process.pid}", daemon=True
        )
        self._reader.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        hide_gpu_noise = self.echo and not nvidia_gpu_present()
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            with self._lock:
                self._lines.append(line)
                if self._log_fh:
                    self._log_fh.write(line)
                    self._log_fh.flush()
            if not self.echo:
                continue
            if hide_gpu_noise and GPU_NOISE_LINE.search(line):
                if self._gpu_noise_explained:
                    continue
                self._gpu_noise_explained, line = True, GPU_NOISE_NOTE
            sys.stderr.write(line)
            sys.stderr.flush()
        proc.stdout.close()

    def _note(self, message: str) -> None:
        """One line of this wrapper's own in the server's log (log_text, log_file) and on stderr."""
        line = f"[server.process] {message}\n"
        with self._lock:
            self._lines.append(line)
            if self._log_fh:
                self._log_fh.write(line)
                self._log_fh.flush()
        sys.stderr.write(line)
        sys.stderr.flush()

    def _http(self, method: str, path: str, body: bytes | None = None):
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
        """Block until /v2/health/ready answers 200 (then record the h3_dit stub's pid). Raises
        LaunchError, with the server log's errors and tail, when the process exits first, when a
        model failed to load, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        up_not_ready_since = None
        while True:
            rc = self.process.poll()
            if rc is not None:
                self._join_reader()
                raise LaunchError(self._failure(f"tritonserver exited with code {rc} before it became ready"))
            status, _ = self._http("GET", "/v2/health/ready")
            if status == 200:
                self.ready = True
                self.stubs = stub_pids(self.process.pid)
                self.dit_stubs = dit_stubs(self.stubs)
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
        return [f"{m.get('name')}: {m.get('reason', '')}" for m in index if m.get("state") == "UNAVAILABLE"]

    def _failure(self, headline: str, tail: int = 40) -> str:
        lines = self.log_text().splitlines()
        key = [ln for ln in lines if _FAILURE_LINE.search(ln) and not GPU_NOISE_LINE.search(ln)]
        parts = [f"{headline} (command: {' '.join(self.command())})"]
        if key:
            parts += ["--- errors from the server log ---", *list(dict.fromkeys(key))[:20]]
        parts += [
            f"--- last {min(tail, len(lines))} lines of the server log"
            + (f" ({self.log_file})" if self.log_file else "")
            + " ---",
            *lines[-tail:],
        ]
        return "\n".join(parts)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server process exits; return its exit code."""
        return self.process.wait(timeout)

    def h3_metrics(self) -> dict[str, float]:
        """The h3_* gauges and counters on /metrics (histograms left out), each summed over its
        series (one per DiT instance; the heartbeat: the oldest), plus ``pending``: Triton's
        nv_inference_pending_request_count of h3_dit. {} if /metrics does not answer."""
        text = read_metrics(self.metrics_url)
        if text is None:
            return {}
        values = {}
        for sample in metric_samples(text):
            if sample.name.startswith("h3_") and not sample.name.endswith(HISTOGRAM_SUFFIXES):
                if sample.name == "h3_heartbeat_timestamp_seconds":
                    values[sample.name] = min(values.get(sample.name, sample.value), sample.value)
                else:
                    values[sample.name] = values.get(sample.name, 0.0) + sample.value
        for sample in metric_samples(text, "nv_inference_pending_request_count", model=DIT_MODEL):
            values["pending"] = sample.value
        return values

    def drain(self, timeout: float | None = None, decode_stall_s: float = DECODE_STALL_S) -> None:
        """Send SIGUSR1 to every h3_dit stub, which then ends every request with a CANCELLED:
        final response at its next step boundary and refuses newcomers with UNAVAILABLE:; wait
        up to ``timeout`` s (None: the server's drain_timeout_s) until they report no request and
        no step running. Then wait until h3_vae holds no decode (h3_vae_decodes: every result
        denoised before the drain is delivered, and h3_vae sends nothing while tritonserver
        stops), for as long as its decodes progress: the wait is cut only when none finished or
        started for ``decode_stall_s`` s. What is still held when a wait is cut is logged in one
        line naming it (the stop cuts it). No-op when the repository has no h3_dit or one of its
        stubs is gone; no wait for decodes when any model's stub is gone."""
        if not self.dit_stubs or self.dit_stubs != dit_stubs(stub_pids(self.process.pid)):
            return
        timeout = self.drain_timeout_s if timeout is None else timeout
        for pid in self.dit_stubs:
            os.kill(pid, signal.SIGUSR1)
        busy = ("h3_active_requests", "h3_waiting_requests", "h3_execute_in_progress")
        m = self._wait_idle(busy, timeout, lambda m: None)
        if m is not None:
            held = ", ".join(f"{name} {m[name]:g}" for name in busy if m.get(name))
            self._note(
                f"drain: after {timeout:g} s the DiT still holds {held or 'requests'}; the stop cuts them "
                "(a longer --drain-timeout lets it reach a step boundary)"
            )
        if gone_stub(self.stubs, self.process.pid) is not None:
            return  # a dead model process (h3_vae's, say) finishes nothing: the stop follows at once
        decodes = ("h3_vae_decodes",)
        m = self._wait_idle(decodes, decode_stall_s, lambda m: (m.get("h3_vae_decodes"), m.get("h3_vae_decodes_total")))
        if m is not None:
            self._note(
                f"drain: no decode of h3_vae progressed for {decode_stall_s:g} s; the stop cuts the "
                f"{m.get('h3_vae_decodes', 0):g} still open"
            )

    def _wait_idle(self, busy: Sequence[str], patience: float, progress) -> dict | None:
        """Poll h3_metrics() until none of `busy` is non-zero; returns None then, or the last
        metrics once `patience` s passed without a change of progress(metrics)."""
        m, last, since = {}, None, time.monotonic()
        while True:
            m = self.h3_metrics()
            if m and not any(m.get(name) for name in busy):
                return None
            now, state = time.monotonic(), progress(m) if m else None
            if state != last:
                last, since = state, now
            if now - since >= patience:
                return m
            time.sleep(0.05)

    def failure(self, stale_after: float) -> str | None:
        """Why the server can no longer serve, or None. Measured on Triton 2.51: when a model's
        stub dies (h3_dit, h3_encoder, h3_vae or h3_cancel), live and ready stay 200 and the stub
        is not restarted; every request to h3_dit or h3_encoder then fails with "Stub process
        'h3_dit_0_0' is not healthy.", and h3_vae's clients get nothing at all (gone_stub). A
        step stuck in Python is not noticed by Triton at all; it shows as an
        instance's heartbeat (h3_heartbeat_timestamp_seconds) older than ``stale_after`` s while
        its step runs (h3_execute_in_progress), or every instance's while requests wait in
        Triton's queue for h3_dit (an idle instance does not iterate)."""
        code = self.process.poll()
        if code is not None:
            return f"tritonserver exited with code {code}"
        gone = gone_stub(self.stubs, self.process.pid)
        if gone is not None:
            return gone
        text = read_metrics(self.metrics_url)
        return None if text is None else dit_stall(text, stale_after, time.time())

    def gone_model(self) -> str | None:
        """Why the server can no longer serve without a restart, or None: tritonserver exited,
        or a model's stub is gone (gone_stub). Unlike failure(), a stalled heartbeat is not
        counted: the launcher without --supervise stops a server this returns a reason for."""
        code = self.process.poll()
        if code is not None:
            return f"tritonserver exited with code {code}"
        return gone_stub(self.stubs, self.process.pid)

    def kill(self) -> int | None:
        """Stop a broken server at once (no drain): SIGKILL its process group. Open streams
        end with gRPC UNAVAILABLE ("Stream removed")."""
        self.ready = False
        return self.stop(grace=0)

    def stop(self, grace: float | None = None) -> int | None:
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
