"""The python-backend stub processes of a tritonserver (one per model instance), read from /proc:
which run (`stub_pids`), which of those recorded at start are gone (`gone_stub`), and the
tritonserver serving a given HTTP port (`tritonserver_pid`). Used by server.process (the drain,
--supervise) and server.health (the container's probe). Imports nothing heavy."""

from __future__ import annotations

import re
from pathlib import Path

from .environment import STUB_NAME

DIT_MODEL = "h3_dit"  # the decoupled DiT: drained before a stop, watched by --supervise


def stub_pids(server_pid: int) -> dict[int, str]:
    """Pid -> model instance name (e.g. ``h3_dit_0_0``) of each python backend stub that is a
    child of ``server_pid`` (read from /proc; the stub's first argument is
    ``<repository>/<model>/<version>/model.py``, a later one the instance name). Keyed by pid:
    Triton gives the instances of a KIND_GPU group on different GPUs the same name."""
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
            model = Path(argv[1].decode()).parents[1].name
            instance = next(arg.decode() for arg in argv[2:] if re.fullmatch(rf"{model}_\d+_\d+".encode(), arg))
            pids[int(entry.name)] = instance
    return pids


def stub_model(instance: str) -> str:
    """The model of a stub's instance name (``h3_vae_0_0`` -> ``h3_vae``)."""
    return instance.rsplit("_", 2)[0]


def gone_stub(recorded: dict[int, str], server_pid: int) -> str | None:
    """Why the server's model processes are incomplete, or None: the first of ``recorded``
    (stub_pids() when the server became ready) no longer running. Triton 2.51 restarts no stub
    of a decoupled model and keeps /v2/health/ready at 200: every request to that model fails
    (or, for h3_vae, hangs) until the server restarts."""
    live = stub_pids(server_pid)
    gone = sorted(pid for pid, instance in recorded.items() if live.get(pid) != instance)
    if not gone:
        return None
    return f"the {stub_model(recorded[gone[0]])} process (pid {gone[0]}) is gone"


def tritonserver_pid(http_port: int) -> int | None:
    """The pid of the tritonserver process on this host whose command line serves HTTP on
    ``http_port`` (server.process.TritonServer.command's ``--http-port N``), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if Path(argv[0].decode(errors="replace")).name != "tritonserver":
            continue
        ports = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == b"--http-port"]
        ports += [arg.split(b"=", 1)[1] for arg in argv if arg.startswith(b"--http-port=")]
        if str(http_port).encode() in ports:
            return int(entry.name)
    return None


def dit_stubs(pids: dict[int, str]) -> list[int]:
    """The pids of the h3_dit instances among stub_pids()'s."""
    return sorted(pid for pid, instance in pids.items() if instance.startswith(f"{DIT_MODEL}_"))
