"""Helpers for the Videos API tests: the front end (python -m videos_api) in its own process,
so that a test can kill it, and waiting for a condition."""

import base64
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import httpx2

from server.environment import pick_free_ports

from .serving import ROOT

API_KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# the tests' own HTTP calls: httpx2's default 5 s read timeout is too short for a loaded 2-core machine
# (a POST that creates a job waits for the encoder's admission); a hang still fails, after 120 s
HTTP_TIMEOUT_S = 120
HTTP = SimpleNamespace(
    **{m: partial(getattr(httpx2, m), timeout=HTTP_TIMEOUT_S) for m in ("get", "head", "post", "request")}
)
NUM_FRAMES_RULE = " (NUM_FRAMES; the clip is aligned up to 17n+5 frames, at most max_num_frames=124)"


def api_error(code: str, message: str, param: str | None = None) -> dict:
    """The OpenAI-style error object the front end answers with (the body's `error`)."""
    return {"message": f"{code}: {message}", "type": "invalid_request_error", "param": param, "code": code}


def data_url(data: bytes, kind: str = "image/png") -> str:
    """A base64 data URL of a file."""
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def wait_for(condition, timeout_s: float, what: str):
    """condition()'s first truthy value, asked every 50 ms; AssertionError naming `what` after
    timeout_s seconds (a bound on a hang, not a measurement)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


class FrontEnd:
    """`python -m videos_api` against Triton at `triton_url` on a free port (the same one
    when started again), its data in `data_dir`, its key file `keys` (default: API_KEY alone)
    and any `extra` flags; its output goes to `data_dir`/front_end.log. A context manager:
    started on entry, stopped (SIGTERM) on exit."""

    def __init__(self, triton_url: str, data_dir: Path, *extra: str, keys: str = f"{API_KEY}\n"):
        self.triton_url, self.data_dir, self.extra, self.keys = triton_url, Path(data_dir), extra, keys
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FrontEnd":
        """Start the process and wait until the page answers 200; RuntimeError with its log when
        it exits first."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        keys = self.data_dir / "keys.txt"
        keys.write_text(self.keys, encoding="utf-8")
        if not self.port:
            (self.port,) = pick_free_ports(1, "127.0.0.1")
        command = [sys.executable, "-m", "videos_api", "--triton-url", self.triton_url]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir), "--api-key-file", str(keys)]
        with open(self.data_dir / "front_end.log", "a") as log:
            self.process = subprocess.Popen([*command, *self.extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, f"the front end at {self.url}")
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the front end exited with {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log(self) -> str:
        """What the front end printed."""
        return (self.data_dir / "front_end.log").read_text()

    def kill(self) -> None:
        """SIGKILL the front end: no shutdown code runs."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int:
        """SIGTERM the front end, wait for it; its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "FrontEnd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
