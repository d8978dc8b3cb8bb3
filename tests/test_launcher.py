"""server.environment, server.process and the server.launch CLI: end-to-end against a real
tritonserver (trivial throwaway models), the metrics parsing against fixed pages."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from server import environment, launch, process  # noqa: E402 - after the sys.path set-up above
from server.environment import LaunchError, check_numpy_for_stub, nvidia_gpu_present, pick_free_ports  # noqa: E402 - after the sys.path set-up above
from server.process import GPU_NOISE_LINE, GPU_NOISE_NOTE, TritonServer, metric_samples  # noqa: E402 - after the sys.path set-up above

ADD_ONE_CONFIG = """\
name: "add_one"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ADD_ONE_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

BAD_MODEL = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("weights for bad_model are missing (deliberate test failure 4711)")

    def execute(self, requests):
        return []
"""


def _write_model(repo: Path, name: str, config: str, model_py: str) -> None:
    d = repo / name / "1"
    d.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config.replace('"add_one"', f'"{name}"'))
    (d / "model.py").write_text(textwrap.dedent(model_py))


def _gone(pid: int) -> bool:
    """The server was reaped and nothing is left in its process group (stubs included)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def add_one_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    _write_model(repo, "add_one", ADD_ONE_CONFIG, ADD_ONE_MODEL)
    return repo


def test_trivial_model_round_trip_and_clean_stop(add_one_repo: Path, tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    log_file = tmp_path / "server.log"
    with TritonServer(add_one_repo, free_ports=True, log_file=log_file, timeout=60) as server:
        assert server.is_running()
        assert server.grpc_url.startswith("127.0.0.1:")
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.array([[1.0, 2.0, 3.5]], dtype=np.float32)
        inp = grpcclient.InferInput("X", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        y = client.infer("add_one", [inp], client_timeout=30).as_numpy("Y")
        np.testing.assert_array_equal(y, x + 1)
        client.close()
        pid = server.pid
    assert server.process.returncode is not None
    assert _gone(pid), "tritonserver or a python stub survived stop()"
    assert "add_one" in server.log_text()
    assert "add_one" in log_file.read_text()
    assert server.stop() == server.process.returncode  # idempotent


def test_failing_initialize_fails_fast_with_the_model_message(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_model(repo, "add_one", ADD_ONE_CONFIG, ADD_ONE_MODEL)
    _write_model(repo, "bad_model", ADD_ONE_CONFIG, BAD_MODEL)
    server = TritonServer(repo, free_ports=True, timeout=90)
    with pytest.raises(LaunchError) as info:
        server.start()
    # failed on the model's error, not on the 90 s readiness timeout ("tritonserver not ready after 90 s")
    assert re.match(
        r"(tritonserver exited with code \d+ before it became ready|models failed to load: )", str(info.value)
    )
    assert "deliberate test failure 4711" in str(info.value)
    assert "bad_model" in str(info.value)
    assert _gone(server.pid)


def test_cli_then_runs_command_with_urls_and_returns_its_exit_code(add_one_repo: Path) -> None:
    probe = (
        "import os, sys, urllib.request\n"
        "for k in ('H3_GRPC_URL', 'H3_HTTP_URL', 'H3_METRICS_URL'): print(k, os.environ[k])\n"
        "r = urllib.request.urlopen('http://' + os.environ['H3_HTTP_URL'] + '/v2/health/ready')\n"
        "assert r.status == 200\n"
        "sys.exit(7)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.launch",
            "--model-repository",
            str(add_one_repo),
            "--free-ports",
            "--timeout",
            "60",
            "--then",
            sys.executable,
            "-c",
            probe,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "H3_GRPC_URL 127.0.0.1:" in proc.stdout
    assert "H3_METRICS_URL http://127.0.0.1:" in proc.stdout
    assert "ready" in proc.stderr


def test_busy_port_is_refused_before_starting(add_one_repo: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = TritonServer(
            add_one_repo,
            grpc_port=port,
            http_port=port + 1 if port < 65535 else port - 1,
            metrics_port=port - 2,
            log_file=tmp_path / "log.txt",
        )
        with pytest.raises(LaunchError, match=rf"port {port} on 127.0.0.1 is already in use"):
            server.start(timeout=30)
        assert not server.is_running()


NUMPY2_MESSAGE = (
    "numpy 2.2.6 is installed at /venv/lib/python3.11/site-packages/numpy, and Triton 2.51's python backend "
    "stub cannot read BYTES tensors with numpy 2 (the stub aborts on the first string input; requests then "
    "fail with \"Stub process '<model>' is not healthy\"); install numpy 1 in this environment: "
    'pip install "numpy<2" (requirements.txt pins numpy==1.26.4)'
)


def test_numpy_2_is_refused_for_the_stub() -> None:
    with pytest.raises(LaunchError) as info:
        check_numpy_for_stub("2.2.6", "/venv/lib/python3.11/site-packages/numpy")
    assert str(info.value) == NUMPY2_MESSAGE
    with pytest.raises(LaunchError, match=r"^numpy 2\.0\.0rc1 is installed at /n, "):
        check_numpy_for_stub("2.0.0rc1", "/n")
    for version in ("1.26.4", "1.24.0", "1.26.5.dev0+git"):
        assert check_numpy_for_stub(version, "/n") is None
    # This environment (requirements.txt) passes; its version is read without importing numpy.
    assert environment.stub_numpy() == ("1.26.4", str(Path(np.__file__).parent))


def test_start_and_cli_refuse_numpy_2_before_spawning(add_one_repo: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(process, "stub_numpy", lambda: ("2.2.6", "/venv/lib/python3.11/site-packages/numpy"))
    server = TritonServer(add_one_repo, free_ports=True)
    with pytest.raises(LaunchError) as info:
        server.start()
    assert str(info.value) == NUMPY2_MESSAGE
    assert server.process is None  # refused before tritonserver was started
    assert launch.main(["--model-repository", str(add_one_repo), "--free-ports", "--then", "true"]) == 1
    assert capsys.readouterr().err == f"[server.launch] {NUMPY2_MESSAGE}\n"


def test_stub_library_path_holds_only_libpython(tmp_path: Path, monkeypatch) -> None:
    """LD_LIBRARY_PATH gets a folder with one link to this interpreter's libpython, never the
    interpreter's LIBDIR: on an Ubuntu host LIBDIR is /usr/lib/x86_64-linux-gnu, whose cuDNN 9.14
    then outranked PyTorch's own 9.19 inside the stub (H200, 2026-11-30: DiT step 440 ms vs 366)."""
    target = environment.libpython_path()
    assert target is not None and Path(target).name == f"libpython{environment.python_version_tag()}.so.1.0"
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/other")
    env = environment.server_env()
    folder = Path(env["LD_LIBRARY_PATH"].split(os.pathsep)[0])
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[1:] == ["/opt/other"]
    assert folder == environment.pytriton_tritonserver_dir() / "python_lib" / environment.python_version_tag()
    assert [p.name for p in folder.iterdir()] == [Path(target).name]
    assert os.readlink(folder / Path(target).name) == target
    assert str(Path(target).parent) not in env["LD_LIBRARY_PATH"].split(os.pathsep)
    # a stale link (another interpreter) is replaced
    other = environment.libpython_dir(tmp_path)
    (other / Path(target).name).unlink()
    (other / Path(target).name).symlink_to("/nonexistent/libpython.so")
    assert os.readlink(environment.libpython_dir(tmp_path) / Path(target).name) == target


def test_nvidia_gpu_present_reads_the_device_nodes(tmp_path: Path) -> None:
    assert nvidia_gpu_present(str(tmp_path)) is False
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia0x"):  # a driver without a GPU
        (tmp_path / name).touch()
    assert nvidia_gpu_present(str(tmp_path)) is False
    (tmp_path / "nvidia3").touch()
    assert nvidia_gpu_present(str(tmp_path)) is True


@pytest.mark.parametrize("gpu", [False, True])
def test_echo_leaves_out_the_gpu_messages_only_without_a_gpu(
    add_one_repo: Path, monkeypatch, capsys, gpu: bool
) -> None:
    # This machine has no GPU, so tritonserver logs NVML, DCGM and CUDA driver failures; the
    # echo hides them (and says why, once) only where nvidia_gpu_present() finds no GPU.
    monkeypatch.setattr(process, "nvidia_gpu_present", lambda: gpu)
    with TritonServer(add_one_repo, free_ports=True, echo=True, timeout=60) as server:
        pass
    log = server.log_text()
    noise = [line + "\n" for line in log.splitlines() if GPU_NOISE_LINE.search(line)]
    assert "Error: Failed to initialize NVML\n" in noise
    assert any("DCGM unable to start" in line for line in noise)
    err = capsys.readouterr().err
    assert "successfully loaded 'add_one'" in err
    if gpu:
        assert GPU_NOISE_NOTE not in err and all(line in err for line in noise)
    else:
        assert err.count(GPU_NOISE_NOTE) == 1  # and every other line of the log as it came
        assert err.replace(GPU_NOISE_NOTE, "") == "".join(
            line for line in log.splitlines(keepends=True) if not GPU_NOISE_LINE.search(line)
        )


TRITON_METRICS_PAGE = """\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="h3_vae",version="1"} 2
nv_inference_pending_request_count{model="h3_dit",version="1"} 3
# HELP h3_active_requests Requests in the pack
# TYPE h3_active_requests gauge
h3_active_requests{model="h3_dit",version="1"} 1
# HELP h3_cancellations_total Requests cancelled
# TYPE h3_cancellations_total counter
h3_cancellations_total{model="h3_dit",version="1"} 4
# HELP h3_step_seconds Step time
# TYPE h3_step_seconds histogram
h3_step_seconds_count{model="h3_dit",version="1"} 2
h3_step_seconds_sum{model="h3_dit",version="1"} 0.75
h3_step_seconds_bucket{model="h3_dit",version="1",le="0.5"} 1
h3_step_seconds_bucket{model="h3_dit",version="1",le="+Inf"} 2
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 81234567890
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 1.5e+09
"""


def test_metric_samples_filter_by_name_and_labels() -> None:
    pending = metric_samples(TRITON_METRICS_PAGE, "nv_inference_pending_request_count")
    assert [(s.labels["model"], s.value) for s in pending] == [("h3_vae", 2.0), ("h3_dit", 3.0)]
    assert [s.value for s in metric_samples(TRITON_METRICS_PAGE, "nv_gpu_memory_used_bytes")] == [81234567890.0, 1.5e9]
    assert [s.value for s in metric_samples(TRITON_METRICS_PAGE, "h3_step_seconds_bucket", le="+Inf")] == [2.0]
    assert metric_samples(TRITON_METRICS_PAGE, "h3_active_requests", model="h3_vae") == []
    assert len(metric_samples(TRITON_METRICS_PAGE)) == 10
    assert metric_samples("") == []
    with pytest.raises(ValueError):
        metric_samples('h3_active_requests{model="h3_dit"} not-a-number\n')


def test_h3_metrics_reads_gauges_counters_and_the_dits_pending_requests() -> None:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            body = TRITON_METRICS_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page) as page:
        threading.Thread(target=page.serve_forever, daemon=True).start()
        server = TritonServer(metrics_port=page.server_address[1])
        assert server.h3_metrics() == {"h3_active_requests": 1.0, "h3_cancellations_total": 4.0, "pending": 3.0}
        page.shutdown()
    (nobody,) = pick_free_ports(1)
    assert TritonServer(metrics_port=nobody).h3_metrics() == {}


def test_a_drain_that_outlasts_its_timeout_names_what_the_stop_cuts(monkeypatch, capsys) -> None:
    """TritonServer.drain signals the h3_dit stubs, waits drain_timeout_s (launcher
    --drain-timeout) for the DiT, then for h3_vae's decodes while they progress, and logs one
    line naming what is left when a wait is cut."""
    server = TritonServer(Path("/nonexistent"), drain_timeout_s=0.2)
    server.process, server.dit_stubs, signalled = type("Proc", (), {"pid": 1})(), [4242], []
    monkeypatch.setattr(process, "stub_pids", lambda pid: {4242: "h3_dit_0_0"})
    monkeypatch.setattr(process.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(server, "h3_metrics", lambda: {"h3_active_requests": 1.0, "h3_vae_decodes": 2.0})
    server.drain(decode_stall_s=0.2)
    lines = (
        "[server.process] drain: after 0.2 s the DiT still holds h3_active_requests 1; the stop cuts them "
        "(a longer --drain-timeout lets it reach a step boundary)\n"
        "[server.process] drain: no decode of h3_vae progressed for 0.2 s; the stop cuts the 2 still open\n"
    )
    assert signalled == [(4242, process.signal.SIGUSR1)]
    assert server.log_text() == lines and capsys.readouterr().err == lines
    assert launch._parser().parse_args(["--drain-timeout", "30"]).drain_timeout == 30.0
