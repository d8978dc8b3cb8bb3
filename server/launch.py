"""The launcher CLI: start tritonserver (the 2.51 binary shipped in the nvidia-pytriton wheel) on a
model repository.

    python -m server.launch [--model-repository DIR | REPOSITORY OPTIONS] [--host ADDR]
                            [--http-port P] [--grpc-port P] [--metrics-port P] [--free-ports]
                            [--timeout SECONDS] [--exit-timeout SECONDS] [--drain-timeout SECONDS]
                            [--log-file PATH]
                            [--model-control {none,explicit}] [--server-arg ARG]... [--quiet]
                            [--supervise [--stale-after SECONDS]] [--then CMD ARGS...]

    REPOSITORY OPTIONS: [--config NAME] [--checkpoint DIR] [--device {cpu,cuda,auto}]
                        [--gpus all|0,1] [--placement shared|own|cpu] [--dit-instances N]
                        [--set MODEL.KEY=VALUE]...
                        [--write-repository DIR]

Without repository options it serves ``--model-repository`` (default: model_repository/, the
shipped CPU repository). With any of them it first runs the repository writer
(``python -m server.repository``, in its own process, so that the launcher holds no CUDA context)
with those options, into a temporary folder removed at exit or into ``--write-repository DIR``,
and serves that.

Without ``--then`` the server runs in the foreground until SIGINT/SIGTERM (or until it dies, or a
model's process dies: then it is stopped, so its clients end with UNAVAILABLE; with
``--supervise`` it is restarted instead, see ``TritonServer.failure``), its log echoed to
stderr unless ``--quiet`` (without an NVIDIA GPU, less the expected GPU start-up messages: see
server.process). With ``--then`` the command runs once the server is ready, with ``H3_GRPC_URL``,
``H3_HTTP_URL`` and ``H3_METRICS_URL`` in its environment; the server is then stopped and the
launcher exits with the command's exit code.

The server's environment (binary, stub, libpython, numpy check, ports) is server.environment; the
process object (start, readiness, drain, stop, supervision checks) is server.process.TritonServer.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .environment import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_MODEL_REPOSITORY,
    LaunchError,
)
from .options import add_arguments, given_options
from .process import DEFAULT_STALE_AFTER_S, DRAIN_TIMEOUT_S, TritonServer

SUPERVISE_INTERVAL_S = 1.0


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_if_gone(server: TritonServer) -> bool:
    """Without --supervise: kill a server whose model process died (TritonServer.gone_model),
    so that its clients in flight end with UNAVAILABLE instead of waiting for nothing (a dead
    h3_vae's clients got no response at all) and a container's restart policy takes over.
    Returns True when it killed the server."""
    if not server.ready:
        return False
    reason = server.gone_model()
    if reason is None or reason.startswith("tritonserver exited"):
        return False
    _say(f"{reason}: stopping tritonserver (--supervise restarts it instead)")
    server.kill()
    return True


def _raise_stop(signum, _frame):
    raise _Stop(signum)


def _say(msg: str) -> None:
    print(f"[server.launch] {msg}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m server.launch",
        description="Run tritonserver (from the nvidia-pytriton wheel) on the model repository.",
    )
    p.add_argument(
        "--model-repository",
        help=f"model repository to serve (default: {DEFAULT_MODEL_REPOSITORY}); not with the repository options",
    )
    add_arguments(p)
    p.add_argument(
        "--write-repository", metavar="DIR", help="write the repository into DIR (kept) instead of a temporary folder"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the HTTP, gRPC and metrics endpoints bind to (default: %(default)s)",
    )
    p.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    p.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    p.add_argument("--free-ports", action="store_true", help="pick three free ports instead")
    p.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for /v2/health/ready (default: %(default)s)"
    )
    p.add_argument(
        "--exit-timeout",
        type=int,
        default=5,
        metavar="SECONDS",
        help="tritonserver's --exit-timeout-secs: how long a stop waits for requests in flight, "
        "after the DiT's drain (default: %(default)s)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=DRAIN_TIMEOUT_S,
        metavar="SECONDS",
        help="how long a stop waits for the DiT's requests to end at a step boundary (default: %(default)s); "
        "then it waits for h3_vae's decodes of the results denoised before it while they progress "
        "(server.process.DECODE_STALL_S), before tritonserver's own stop",
    )
    p.add_argument("--log-file", help="also write the server log to this file")
    p.add_argument(
        "--model-control",
        choices=("none", "explicit"),
        default="none",
        help="'explicit' loads every model and opens the load/unload API to all clients",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra tritonserver argument (repeatable), e.g. --server-arg=--log-verbose=1",
    )
    p.add_argument("--quiet", action="store_true", help="do not echo the server log to stderr in foreground mode")
    p.add_argument(
        "--supervise",
        action="store_true",
        help="foreground mode: restart tritonserver (same ports) when it exits, when the "
        "h3_dit process dies, or when the DiT's heartbeat is stale with work pending",
    )
    p.add_argument(
        "--stale-after",
        type=float,
        default=DEFAULT_STALE_AFTER_S,
        metavar="SECONDS",
        help="--supervise: heartbeat age that counts as a stalled DiT; must exceed the "
        "longest execute() (default: %(default)s)",
    )
    p.add_argument(
        "--then",
        nargs=argparse.REMAINDER,
        metavar="CMD",
        help="once ready, run CMD with H3_GRPC_URL/H3_HTTP_URL/H3_METRICS_URL set, stop "
        "the server and exit with CMD's exit code (must be the last option)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher with ``argv`` (default: sys.argv[1:]) and return its exit status: the
    ``--then`` command's (128 + N when signal N ended it); in the foreground the server's exit code
    (1 for 0: it stopped by itself); 128 + N after signal N; 1 for a LaunchError; 127 when the
    ``--then`` command does not exist; the repository writer's (2) when it refused the repository
    options. Bad flags exit with 2 (argparse)."""
    args = _parser().parse_args(argv)
    if args.then is not None and not args.then:
        _parser().error("--then needs a command")
    if args.supervise and args.then is not None:
        _parser().error("--supervise runs the server in the foreground; it cannot be combined with --then")
    options = given_options(args)
    if args.model_repository is not None and (options or args.write_repository):
        _parser().error(
            "--model-repository serves a repository as it is; it cannot be combined with the repository options"
        )
    if not (options or args.write_repository):
        return _serve(args, args.model_repository or str(DEFAULT_MODEL_REPOSITORY))
    folder = None if args.write_repository else tempfile.mkdtemp(prefix="h3-repository.")
    repository = args.write_repository or str(Path(folder) / "model_repository")
    try:
        command = [sys.executable, "-m", "server.repository", repository, *options]
        _say(f"writing the model repository: {shlex.join(command[1:])}")
        written = subprocess.run(command)
        if written.returncode != 0:
            _say(f"the repository writer refused (exit code {written.returncode}); nothing served")
            return written.returncode
        return _serve(args, repository)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _serve(args: argparse.Namespace, repository: str) -> int:
    """Serve `repository` as the parsed launcher options say; main()'s exit status."""
    server = TritonServer(
        repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        free_ports=args.free_ports,
        log_file=args.log_file,
        model_control=args.model_control,
        timeout=args.timeout,
        exit_timeout_secs=args.exit_timeout,
        drain_timeout_s=args.drain_timeout,
        extra_args=args.server_arg,
        echo=(args.then is None and not args.quiet),
    )
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, _raise_stop) for s in handled}
    child: subprocess.Popen | None = None
    rc = 1
    try:
        t0 = time.monotonic()
        server.start()
        _say(
            f"tritonserver ready in {time.monotonic() - t0:.1f} s (pid {server.pid}): "
            f"grpc={server.grpc_url} http={server.http_url} metrics={server.metrics_url}"
        )
        if args.then:
            env = dict(os.environ, **server.url_env())
            _say(f"running: {shlex.join(args.then)}")
            child = subprocess.Popen(args.then, env=env)
            while True:
                try:
                    rc = child.wait(SUPERVISE_INTERVAL_S)
                    break
                except subprocess.TimeoutExpired:
                    _stop_if_gone(server)
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
            stopped = False
            while server.process.poll() is None and not (stopped := _stop_if_gone(server)):
                time.sleep(SUPERVISE_INTERVAL_S)
            code = server.wait()
            if stopped:
                code = 1
            elif code != 0:
                _say(
                    "tritonserver died with exit code {}:\n{}".format(
                        code, "\n".join(server.log_text().splitlines()[-40:])
                    )
                )
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
