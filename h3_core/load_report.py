"""The DiT's load as the encoder sees it: each h3_dit instance writes how many requests it holds
after every step-loop iteration to a small JSON file; h3_encoder reads them before encoding and
refuses a request with UNAVAILABLE when every instance is full, so a saturated DiT does not
collect a backlog in Triton's queue in front of it (which no model can see or bound).

The files live in one folder per tritonserver process (the models' stubs are its children, so
they share os.getppid()): `<tmp>/h3-triton-<server pid>/dit-<instance>.json`. Triton-free.
"""
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class DitLoad:
    """One h3_dit instance: `held` live requests, capacity max_num_seqs + max_waiting."""

    held: int
    max_num_seqs: int
    max_waiting: int

    @property
    def full(self) -> bool:
        return self.held >= self.max_num_seqs + self.max_waiting

    def message(self) -> str:
        """The UNAVAILABLE text for a newcomer (the scheduler's Overloaded says the same)."""
        return (f"the DiT holds {self.held} requests, its capacity max_num_seqs + max_waiting = {self.max_num_seqs} + "
                f"{self.max_waiting}; retry later")


def load_folder(server_pid: int | None = None) -> Path:
    """The folder of the load files of the tritonserver with pid `server_pid` (None: the
    calling stub's parent, the server)."""
    return Path(tempfile.gettempdir()) / f"h3-triton-{os.getppid() if server_pid is None else server_pid}"


def write_load(folder: Path, instance: str, load: DitLoad) -> None:
    """Replace the instance's load file atomically (write, then rename)."""
    folder.mkdir(exist_ok=True)
    path = folder / f"dit-{instance}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(load)))
    os.replace(temporary, path)


def refusal(folder: Path) -> str | None:
    """The UNAVAILABLE message when every h3_dit instance that reported is full (the emptiest
    one's), else None (also when none reported yet, or a file is unreadable)."""
    loads = []
    for path in sorted(folder.glob("dit-*.json")):
        try:
            loads.append(DitLoad(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            return None
    if not loads or not all(load.full for load in loads):
        return None
    return min(loads, key=lambda load: load.held).message()
