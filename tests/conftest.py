import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest  # noqa: E402 - after the sys.path set-up above


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One tritonserver (tiny config, CPU, max_steps 400) shared by the end-to-end tests."""
    from h3_core.weights.checkpoint_setup import DEFAULT_ROOT, create_checkpoint
    from server.process import TritonServer
    from tests.serving import model_repository_copy

    create_checkpoint("tiny", DEFAULT_ROOT / "tiny")
    repo = model_repository_copy(tmp_path_factory.mktemp("repo") / "model_repository", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


@pytest.fixture
def client(server):
    from client.api import H3Client

    return H3Client(server.grpc_url, idle_timeout_s=120)
