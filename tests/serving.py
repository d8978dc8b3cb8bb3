"""Helpers for the end-to-end tests: a model repository copy with overridden DiT settings, a raw
tritonclient stream, the generate CLI run against a server, and a proxy with an idle timeout."""

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from server.repository import plan, write_repository

ROOT = Path(__file__).resolve().parents[1]


def model_repository_copy(target: Path, dit_instances: int = 1, **dit_parameters) -> Path:
    """The CPU repository (tiny, checkpoints/tiny; nothing sized from this machine) written to
    `target` by server.repository, with `dit_instances` h3_dit instances and the given h3_dit
    parameters (values as strings); returns the new repository path. Raises ValueError for a
    parameter the settings refuse."""
    return write_repository(target, plan(dit_instances=dit_instances, overrides={"h3_dit": dit_parameters}))


def generate_cli(url: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`python -m client.generate --url URL --prompt "from the CLI" --out OUT` on a 64 x 96, 9-frame,
    2-step clip with seed 3, plus `flags`; run from the repository root, its output captured."""
    base = ["--url", url, "--prompt", "from the CLI", "--out", str(out), "--height", "64", "--width", "96"]
    base += ["--num-frames", "9", "--steps", "2", "--seed", "3"]
    return subprocess.run(
        [sys.executable, "-m", "client.generate", *base, *flags], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def tensor(name: str, value, datatype: str):
    """A tritonclient InferInput holding the numpy array `value` as `datatype`."""
    import tritonclient.grpc as grpcclient

    result = grpcclient.InferInput(name, list(value.shape), datatype)
    result.set_data_from_numpy(value)
    return result


def raw_stream(
    url: str,
    inputs,
    *,
    model: str = "h3_pipeline",
    outputs=None,
    parameters=None,
    timeout_s: float = 60.0,
    **stream_kwargs,
):
    """Stream one request with plain tritonclient (stream_kwargs: request_id, sequence_id,
    sequence_start, sequence_end, ...). Returns (responses, error): error is the
    client.api.H3Error the stream ended with (an error response, or an INFO of kind "error"),
    or None. Raises TimeoutError when no response comes within timeout_s; the stream is then
    closed with cancel_requests=True, so a hung request never hangs the test."""
    import json
    import queue

    import tritonclient.grpc as grpcclient

    from client.api import H3Error

    responses, results, ended, ended_early = queue.Queue(), [], False, None
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, inputs, outputs=outputs, parameters=parameters, enable_empty_final_response=True, **stream_kwargs
        )
        while True:
            try:
                result, error = responses.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no response within {timeout_s} s") from None
            if error is not None:
                ended = True
                return results, H3Error.from_server(error)
            results.append(result)
            info = result.as_numpy("INFO")
            if info is not None and info.size and json.loads(info.reshape(-1)[0])["kind"] == "error":
                fields = json.loads(info.reshape(-1)[0])
                ended_early = H3Error(fields["code"], fields["message"])
            if result.get_response().parameters["triton_final_response"].bool_param:
                ended = True
                return results, ended_early
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()


def generate_in_thread(client, outcome: dict, key, **kwargs) -> threading.Thread:
    """Run client.generate(**kwargs) in a started thread; outcome[key] = its results or its
    H3Error."""
    from client.api import H3Error

    def run():
        try:
            outcome[key] = client.generate(**kwargs)
        except H3Error as error:
            outcome[key] = error

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def idle_metrics(server, timeout_s: float = 60.0) -> dict:
    """server.h3_metrics() once h3_dit reports no active and no waiting request, or after
    timeout_s. h3_dit sets those gauges at the end of an execute(), after the final responses
    it sent there, so a client can see its stream end just before they change."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        metrics = server.h3_metrics()
        if (metrics["h3_active_requests"] == 0 and metrics["h3_waiting_requests"] == 0) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.05)


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what a client sends before its first frame (RFC 9113 3.4)
HTTP2_DATA = 0  # frame type of DATA (RFC 9113 6.1)


class Http2Frames:
    """Reads one direction of an HTTP/2 connection as it passes: the client's 24-byte preface
    (when `preface`), then frames of a 9-byte header, length (3 bytes), type, flags, stream (4),
    and `length` bytes of payload (RFC 9113 4.1)."""

    def __init__(self, preface: bool):
        self.skip = len(HTTP2_PREFACE) if preface else 0  # bytes of preface or payload still to pass
        self.header = bytearray()

    def data_frames(self, chunk: bytes) -> int:
        """How many DATA frames begin in `chunk` (the next bytes of this direction)."""
        count, i = 0, 0
        while i < len(chunk):
            if self.skip:
                passed = min(self.skip, len(chunk) - i)
                self.skip, i = self.skip - passed, i + passed
                continue
            taken = min(9 - len(self.header), len(chunk) - i)
            self.header += chunk[i : i + taken]
            i += taken
            if len(self.header) == 9:
                count += self.header[3] == HTTP2_DATA
                self.skip = int.from_bytes(self.header[:3], "big")
                self.header.clear()
        return count


class IdleProxy:
    """A TCP proxy to the gRPC endpoint `upstream` (host:port) that behaves like nginx's gRPC
    proxy with an idle timeout: it closes a connection (both sockets) when no DATA frame went
    either way for `idle_s` seconds. Frames of other types (HTTP/2 PING, WINDOW_UPDATE, SETTINGS)
    pass but do not count, as pings never cross a real proxy (they are hop by hop). `url` is the
    address to connect to instead; `cut` counts the connections closed for idleness. A context
    manager (the listening socket closes at its end)."""

    def __init__(self, upstream: str, idle_s: float):
        host, _, port = upstream.rpartition(":")
        self.upstream, self.idle_s, self.cut = (host, int(port)), idle_s, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> "IdleProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(self.upstream)
            last_data = [time.monotonic()]
            closed = threading.Event()
            for source, target, frames in (
                (downstream, upstream, Http2Frames(preface=True)),
                (upstream, downstream, Http2Frames(preface=False)),
            ):
                threading.Thread(
                    target=self._pump, args=(source, target, frames, last_data, closed), daemon=True
                ).start()
            threading.Thread(target=self._watch, args=(downstream, upstream, last_data, closed), daemon=True).start()

    @staticmethod
    def _pump(source, target, frames: Http2Frames, last_data: list, closed: threading.Event) -> None:
        try:
            while chunk := source.recv(65536):
                if frames.data_frames(chunk):
                    last_data[0] = time.monotonic()
                target.sendall(chunk)
        except OSError:
            pass  # the other side or the watchdog closed it
        closed.set()
        shut(source, target)

    def _watch(self, downstream, upstream, last_data: list, closed: threading.Event) -> None:
        while not closed.wait(0.05):
            if time.monotonic() - last_data[0] > self.idle_s:
                self.cut += 1
                shut(downstream, upstream)
                return


def shut(*sockets: socket.socket) -> None:
    """Shut both directions of each socket (one already closed by its peer is left as it is)."""
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected any more
