"""End-to-end (issue 43): what the server's processes share, through a real tritonserver with two
h3_dit instances (one module-scoped server): a cached request's step cache counts in its memory
limit, and a DiT instance that dies with a request in flight leaves nothing in the registry
(h3_core.serving.shared.registry): its request is not "cancelled", its id is free again. The kill stops
the module's server from serving on that instance: keep it last."""

import os
import signal
import sqlite3
import threading
from contextlib import closing

import pytest

from client.api import H3Client, H3Error
from h3_core.serving.shared.registry import DATABASE_FILE, server_folder
from server.process import TritonServer, dit_stubs, stub_pids

from .serving import model_repository_copy
from .test_field_cases import wait_until

LARGEST = dict(height=256, width=256, num_frames=121, num_inference_steps=2)  # 2,816 rows: 1,265 MiB uncached


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shared_parts")
    repo = model_repository_copy(tmp / "repo", dit_instances=2, max_steps="4000", max_request_mb="1265")
    # exit_timeout_secs 1: after the kill Triton has nothing left to finish; its default 5 s wait
    # for requests in flight would only lengthen the module's teardown
    with TritonServer(repo, free_ports=True, log_file=tmp / "server.log", exit_timeout_secs=1) as server:
        yield server, H3Client(server.grpc_url, idle_timeout_s=120)


def test_a_cached_request_counts_its_step_cache_in_its_memory(served):
    """Issue 43 item 3: the largest request the CPU limits allow needs 1,265 MiB uncached; its step
    cache (768 B a row, 2,816 rows) makes it 1,267 MiB, over max_request_mb 1265: refused before
    any step, naming the field."""
    _, client = served
    with pytest.raises(H3Error) as refused:
        client.generate("cached", **LARGEST, cache_threshold=0.5, request_id="over-memory")
    assert (refused.value.code, refused.value.message) == (
        "INVALID_ARG",
        "memory=1267 MiB is out of range: allowed up to 1265 MiB (max_request_mb)",
    )


def holder_pid(folder, request_id: str) -> int | None:
    """The pid of the DiT instance whose registry row holds `request_id` live, read from the
    server's registry database (None while it is not live)."""
    with closing(sqlite3.connect(folder / DATABASE_FILE)) as db:
        row = db.execute(
            "SELECT instances.pid FROM live JOIN instances USING (instance) WHERE request_id = ?", (request_id,)
        ).fetchone()
    return None if row is None else row[0]


def test_a_killed_dit_instance_leaves_no_live_id_behind(served):
    """Issue 43 item 2: a DiT instance is SIGKILLed with a 4000-step request in flight (progress
    off, so no response is on its way). Its client gets an error; a cancel of that id then
    answers "unknown" (not "cancelled" for a request that is gone), and the registry holds the
    id live nowhere (a new request may take it)."""
    server, client = served
    folder, outcome = server_folder(server.pid), {}

    def run():
        try:
            client.generate("doomed", num_inference_steps=4000, request_id="doomed")
        except H3Error as error:
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    assert wait_until(lambda: holder_pid(folder, "doomed") is not None, 60)
    pid = holder_pid(folder, "doomed")
    assert pid in dit_stubs(stub_pids(server.pid))
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive() and outcome["error"].code == "UNAVAILABLE"
    assert client.cancel("doomed") == "unknown"
    assert holder_pid(folder, "doomed") is None
