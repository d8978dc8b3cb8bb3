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


@pytest.fixture(scope="session")
def budget_server(tmp_path_factory):
    """(server, client): one tritonserver whose h3_dit executes may take steps for 20 s
    (execute_budget_s 20, max_steps 400), shared by tests/test_gone_clients.py and
    tests/test_serving_modes.py (neither kills a model process nor changes the server)."""
    from client.api import H3Client
    from server.process import TritonServer
    from tests.serving import model_repository_copy

    folder = tmp_path_factory.mktemp("budget")
    repo = model_repository_copy(folder / "repo", execute_budget_s="20", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=folder / "server.log") as srv:
        yield srv, H3Client(srv.grpc_url, idle_timeout_s=120)


@pytest.fixture
def client(server):
    from client.api import H3Client

    return H3Client(server.grpc_url, idle_timeout_s=120)


GPU_ASK = "run make test-gpu (pytest -m gpu tests/test_gpu.py): cuBLAS must be set up before the process's first GEMM"


def gpu_skip_reason(config) -> str | None:
    """Why the tests marked `gpu` are skipped in this run, or None when they run: they need a CUDA
    device, and they run only when asked for with -m gpu (make test-gpu), because they set
    CUBLAS_WORKSPACE_CONFIG, which cuBLAS reads at the process's first GEMM."""
    import torch

    if not torch.cuda.is_available():
        return "gpu: needs a CUDA device (torch.cuda.is_available() is False); run make test-gpu on a GPU host"
    markexpr = config.getoption("markexpr") or ""
    if "gpu" not in markexpr.split() or "not gpu" in markexpr:
        return f"gpu: not asked for with -m gpu; {GPU_ASK}"
    return None


# the longest files (about 2-3 minutes each on the idle 2-core machine), run first: make test runs the
# files on 2 pytest-xdist workers, each file whole on one (--dist loadfile), so a long file started
# last would leave the other worker idle at the end
LONGEST_FILES = (
    "test_field_cases.py",
    "test_benchmarks_smoke.py",
    "test_benchmarks_models_smoke.py",
    "test_demo_model.py",
    "test_field_cases_vae.py",
)


def pytest_collection_modifyitems(config, items):
    """Put the LONGEST_FILES first (each file's own order kept) and skip the tests marked `gpu` with
    the reason gpu_skip_reason gives (shown by pytest -rs)."""
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: every file's order kept
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = gpu_skip_reason(config) if gpu_items else None
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))
