"""End-to-end: Ctrl-C (SIGINT) at each moment of `python -m client.generate` ends it with one line
and a known exit status within EXIT_LIMIT_S: during its imports, during the steps (cancelled on the
server), during the decode (the clip that arrives is written), after the result, and while the
server does not answer. The moments are found from the program's output (its progress bar and
lines), its loaded libraries, or the connections it makes; not from sleeps."""

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from client.api import CANCEL_WAIT_S

from .serving import ROOT
from .test_serving_control import metric

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SIGINT delivery and /proc as on Linux")

EXIT_LIMIT_S = 60  # outer limit on a run's exit after its SIGINT (the program's own: generate.HARD_EXIT_S)
WAIT_S = 60  # outer limit on reaching a moment


class Cli:
    """`python -m client.generate --out <tmp>/x.mp4 --request-id <request_id> *flags` running in
    ROOT; two threads read its stdout and stderr as they come."""

    def __init__(self, tmp_path: Path, request_id: str, *flags: str):
        self.out_file, self.request_id = tmp_path / "x.mp4", request_id
        command = ["--out", str(self.out_file), "--request-id", request_id, "--prompt", "a red ball", *flags]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "client.generate", *command],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.text = {"stdout": b"", "stderr": b""}
        self.changed = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(name, getattr(self.process, name)), daemon=True)
            for name in self.text
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, name: str, pipe) -> None:
        while chunk := pipe.read1(65536):
            with self.changed:
                self.text[name] += chunk
                self.changed.notify_all()

    def wait_for(self, name: str, text: bytes) -> None:
        """Return once `text` is in the program's stdout or stderr (`name`); fail after WAIT_S."""
        with self.changed:
            assert self.changed.wait_for(lambda: text in self.text[name], timeout=WAIT_S), self.text

    def interrupt(self) -> tuple[int, list[str], list[str]]:
        """Send SIGINT (nothing if the program has exited); wait for its exit (at most
        EXIT_LIMIT_S). Returns (exit status, its stdout lines, its stderr lines without the
        progress bar and empty lines)."""
        self.process.send_signal(signal.SIGINT)
        status = self.process.wait(timeout=EXIT_LIMIT_S)
        for reader in self.readers:
            reader.join(10)
        bar = ("denoising", "denoised, decoding")
        stderr = self.text["stderr"].decode().splitlines()  # the bar's updates end with \r
        assert "Traceback" not in self.text["stderr"].decode()
        return (
            status,
            self.text["stdout"].decode().splitlines(),
            [line for line in stderr if line and not line.startswith(bar)],
        )


def wrote(cli: Cli, shape: str, steps: int) -> str:
    """A pattern of the program's "wrote ..." line for one clip of `shape` (e.g. 22 frames 96x64)."""
    return rf"wrote {re.escape(str(cli.out_file))} \({shape}, {steps} steps\) in \d+\.\d\d s, seed \d+"


def is_mp4(path: Path) -> bool:
    return path.read_bytes()[4:8] == b"ftyp"


def test_ctrl_c_during_the_imports(tmp_path, server):
    # SIGINT once numpy's core library is loaded: the program's handler is installed, grpc and
    # tritonclient are still to come; the imports finish, then nothing is sent
    cli = Cli(tmp_path, "ctrl-c-imports", "--url", server.grpc_url)
    maps, deadline = Path(f"/proc/{cli.process.pid}/maps"), time.monotonic() + WAIT_S
    while "_multiarray_umath" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert cli.interrupt() == (130, [], ["interrupted before the request was sent"])
    assert not cli.out_file.exists()


def test_ctrl_c_during_the_steps_cancels_on_the_server(tmp_path, server):
    before = metric(server, "h3_cancellations_total") or 0
    cli = Cli(tmp_path, "ctrl-c-steps", "--steps", "400", "--url", server.grpc_url)
    cli.wait_for("stderr", b"/400")  # the progress bar: the request runs
    status, stdout, stderr = cli.interrupt()
    assert (status, stdout) == (130, [])
    (line,) = stderr
    assert re.fullmatch(r"cancelled on the server: request ctrl-c-steps cancelled by request at step \d+ of 400", line)
    assert metric(server, "h3_cancellations_total") == before + 1
    assert not cli.out_file.exists()


def test_ctrl_c_during_the_decode_writes_the_clip(tmp_path, server):
    # 256x256, 22 frames: a decode of a second or more on the CPU server; the cancel finds the
    # request finished, and the result arrives
    flags = ["--steps", "2", "--height", "256", "--width", "256", "--num-frames", "22"]
    cli = Cli(tmp_path, "ctrl-c-decode", *flags, "--url", server.grpc_url)
    cli.wait_for("stderr", b"denoised, decoding")
    status, stdout, stderr = cli.interrupt()
    assert (status, stderr) == (0, [])
    (line,) = stdout
    assert re.fullmatch("the result arrived; " + wrote(cli, "22 frames 256x256", 2), line)
    assert is_mp4(cli.out_file)


def test_ctrl_c_after_the_result(tmp_path, server):
    cli = Cli(tmp_path, "ctrl-c-after", "--steps", "2", "--url", server.grpc_url)
    cli.wait_for("stdout", b"\n")
    status, stdout, stderr = cli.interrupt()
    assert (status, stderr) == (0, [])
    (line,) = stdout
    assert re.fullmatch(wrote(cli, "22 frames 96x64", 2), line)
    assert is_mp4(cli.out_file)


def test_ctrl_c_while_the_server_does_not_answer(tmp_path):
    # a listener that accepts connections and never answers: the request's stream and the cancel's
    # both wait; the cancel gives up after CANCEL_WAIT_S, and the program exits with the stream
    # still open (the case that hung at exit, in a gRPC finalizer)
    connections, connected = [], threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:
            while True:
                try:
                    connections.append(listener.accept()[0])
                except OSError:  # the listener closed
                    return
                connected.set()

        threading.Thread(target=accept, daemon=True).start()
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        cli = Cli(tmp_path, "ctrl-c-silent", "--url", url)
        assert connected.wait(WAIT_S)  # the request's stream connects
        result = cli.interrupt()
    for connection in connections:
        connection.close()
    assert result == (
        130,
        [],
        [
            f"could not cancel request ctrl-c-silent on the server: TIMEOUT: no response from {url} "
            f"for {CANCEL_WAIT_S:g} s (idle_timeout_s)"
        ],
    )
    assert not cli.out_file.exists()


# Runs client.generate as `python -m` does, with a tracer that sends SIGINT to the process at the
# module's N-th line event (before that line runs): a Ctrl-C at an exact statement of the module.
AT_STATEMENT = """
import os, runpy, signal, sys
count, target = [0], int(sys.argv[1])
def local(frame, event, arg):
    if event == "line":
        count[0] += 1
        if count[0] == target:
            os.kill(os.getpid(), signal.SIGINT)
    return local
def tracer(frame, event, arg):
    if frame.f_code.co_name == "<module>" and frame.f_code.co_filename.endswith(os.path.join("client", "generate.py")):
        return local
sys.settrace(tracer)
sys.argv = ["generate", *sys.argv[2:]]
runpy.run_module("client.generate", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("statement", [6, 7, 9])
def test_ctrl_c_at_the_modules_first_imports(tmp_path, statement):
    # an early handler is in place after the module's first five line events (its docstring,
    # `import _signal`, the list it fills, the `if __name__` and the handler's installation):
    # a Ctrl-C at `import os` (6), `import signal` (7) or `import threading` (9), the first
    # ~15-65 ms under load, ends the program with its one line, not a KeyboardInterrupt traceback
    flags = ["--url", "127.0.0.1:1", "--prompt", "a", "--out", str(tmp_path / "x.mp4")]
    done = subprocess.run(
        [sys.executable, "-c", AT_STATEMENT, str(statement), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "interrupted before the request was sent\n")
