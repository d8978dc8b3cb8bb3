"""server.health, the container's health check, against a small stand-in HTTP server that answers
/v2/health/ready and /metrics as tritonserver would (a real server: tests/test_launcher.py and the
end-to-end tests)."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from server import health

NOW = 1_000_000.0
FRESH = f"""# TYPE h3_heartbeat_timestamp_seconds gauge
h3_heartbeat_timestamp_seconds{{instance="h3_dit_0_0"}} {NOW - 5}
# TYPE h3_execute_in_progress gauge
h3_execute_in_progress{{instance="h3_dit_0_0"}} 1
"""


@pytest.fixture
def stand_in():
    """(set(ready_status, metrics_text), http_url, metrics_url) of a stand-in server."""
    state = {"ready": 200, "metrics": FRESH}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            status, body = (
                (state["ready"], b"") if self.path == "/v2/health/ready" else (200, state["metrics"].encode())
            )
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    yield lambda ready, metrics: state.update(ready=ready, metrics=metrics), url, f"{url}/metrics"
    server.shutdown()
    server.server_close()


def test_ready_with_a_fresh_heartbeat_is_healthy(stand_in):
    _, http, metrics = stand_in
    assert health.problem(http, metrics, 120, now=NOW) is None


def test_a_stalled_step_not_ready_or_no_heartbeat_is_unhealthy(stand_in):
    set_state, http, metrics = stand_in
    assert health.problem(http, metrics, 120, now=NOW + 200) == (
        "the h3_dit heartbeat of h3_dit_0_0 is 205 s old with work pending"
    )
    set_state(503, FRESH)
    assert health.problem(http, metrics, 120, now=NOW) == f"{http}/v2/health/ready answered 503: not ready"
    set_state(200, "# TYPE nv_inference_count counter\n")
    assert health.problem(http, metrics, 120, now=NOW) == (
        f"no h3_heartbeat_timestamp_seconds on {metrics}: the h3_dit step loop publishes none"
    )
    set_state(200, FRESH.replace('"h3_dit_0_0"} 1', '"h3_dit_0_0"} 0'))
    assert health.problem(http, metrics, 120, now=NOW + 200) is None  # idle: an old heartbeat is no stall


def test_an_unreachable_server_is_unhealthy_and_the_cli_says_why(stand_in, capsys):
    _, http, metrics = stand_in
    nowhere = "http://127.0.0.1:9"  # the discard port: nothing listens
    assert health.problem(nowhere, metrics, 120).startswith(f"{nowhere}/v2/health/ready unreachable: ")
    assert health.main(["--http", http, "--metrics", metrics]) == 1  # the clock is far past NOW: stalled
    assert capsys.readouterr().err.startswith("unhealthy: the h3_dit heartbeat of h3_dit_0_0 is ")


def test_a_missing_model_process_is_named_per_instance_and_gpu(monkeypatch):
    """missing_stub compares the stubs under the tritonserver of the --http port with the models'
    instance groups; Triton names a KIND_GPU group's instances alike on every GPU."""
    configs = {
        "h3_dit": {"backend": "python", "instance_group": [{"name": "h3_dit_0", "count": 1, "gpus": [0, 1]}]},
        "h3_vae": {"backend": "python", "instance_group": [{"name": "h3_vae_0", "count": 2, "gpus": []}]},
        "h3_pipeline": {"platform": "ensemble", "instance_group": []},
    }

    class Answer:
        def __init__(self, body):
            self.body = body

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, *args):
            return health.json.dumps(self.body).encode()

    def urlopen(request, timeout):
        url = request if isinstance(request, str) else request.full_url
        if url.endswith("/v2/repository/index"):
            return Answer([{"name": name, "state": "READY"} for name in configs])
        return Answer(configs[url.split("/")[-2]])

    running = {1: "h3_dit_0_0", 2: "h3_dit_0_0", 3: "h3_vae_0_0", 4: "h3_vae_0_1"}
    monkeypatch.setattr(health.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(health, "tritonserver_pid", lambda port: 7 if port == 8000 else None)
    monkeypatch.setattr(health, "stub_pids", lambda pid: dict(running))
    assert health.missing_stub("http://127.0.0.1:8000") is None
    assert health.missing_stub("http://127.0.0.1:9000") is None  # no tritonserver of that port here
    del running[2]  # one GPU's h3_dit instance
    assert health.missing_stub("http://127.0.0.1:8000") == (
        "the model process h3_dit_0_0 is gone (1 of 2 running): Triton does not restart it and every request to "
        "its model fails"
    )
