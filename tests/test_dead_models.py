"""End to end: a model process that dies (SIGKILL of its Triton python stub) is reported and
repaired (issue 42, item 2). Triton 2.51 restarts no stub and keeps /v2/health/ready at 200:
h3_vae's clients then get no response at all, h3_encoder's and h3_dit's requests fail for ever.
The container's health check (server.health, the Docker and Kubernetes probe) names the dead
process, and `server.launch --supervise` restarts tritonserver on any model's death, which ends
every request in flight with an error (the dead instance's request ids go with the server);
without --supervise the launcher stops the server (exit 1), which ends them the same way."""

import os
import re
import signal
import subprocess
import sys

from client.api import H3Client, H3Error
from server import health
from server.process import TritonServer, stub_pids
from server.repository import plan, write_repository

from .serving import ROOT
from .serving import generate_in_thread as start
from .test_field_cases import launcher_urls, metrics_text, sample, wait_until


def test_the_health_check_names_a_dead_model_process(tmp_path):
    repo = write_repository(tmp_path / "repo", plan())
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        http, metrics = f"http://{server.http_url}", server.metrics_url
        assert health.problem(http, metrics) is None
        (vae,) = [pid for pid, instance in stub_pids(server.pid).items() if instance == "h3_vae_0_0"]
        os.kill(vae, signal.SIGKILL)
        assert wait_until(lambda: vae not in stub_pids(server.pid), 30)
        assert health.problem(http, metrics) == (
            "the model process h3_vae_0_0 is gone (0 of 1 running): Triton does not restart it and every request to "
            "its model fails"
        )
        assert server.failure(stale_after=120) == f"the h3_vae process (pid {vae}) is gone"
        server.kill()  # no drain: h3_vae is gone


def kill_h3_vae_mid_decode(tmp_path, *flags: str):
    """A launcher (`flags` added) serving a repository that allows fault injection, a 2-step
    request whose decode takes 60 s more (decode_slow), and h3_vae's stub SIGKILLed while it
    decodes. Returns (launcher, its log path, client, the request's outcome once its thread ended,
    the dead stub's pid); the caller ends the launcher."""
    allowed = {"allow_fault_injection": "true"}
    repo = write_repository(tmp_path / "repo", plan(overrides={"h3_dit": allowed, "h3_vae": allowed}))
    log = tmp_path / "launcher.log"
    command = ["-m", "server.launch", "--model-repository", str(repo), "--free-ports", "--quiet", *flags]
    launcher = subprocess.Popen([sys.executable, *command], cwd=ROOT, stderr=log.open("w"))
    try:
        urls = launcher_urls(log)
        client, outcome = H3Client(urls["grpc"], idle_timeout_s=120), {}
        pending = start(
            client, outcome, "decoding", prompt="decoding", num_inference_steps=2, inject_fault="decode_slow:60"
        )
        running = 'h3_vae_decodes{model="h3_vae",state="running"}'
        assert wait_until(lambda: f"{running} 1" in metrics_text(urls["metrics"]), 60)
        (vae,) = [pid for pid, instance in stub_pids(urls["pid"]).items() if instance == "h3_vae_0_0"]
        os.kill(vae, signal.SIGKILL)
        pending.join(60)  # before: no response at all (nothing in 130 s)
    except BaseException:
        launcher.kill()
        launcher.wait()
        raise
    return launcher, log, client, outcome.get("decoding"), vae


def test_the_supervisor_restarts_the_server_when_h3_vae_dies_mid_decode(tmp_path):
    launcher, log, client, outcome, vae = kill_h3_vae_mid_decode(tmp_path, "--supervise")
    try:
        assert isinstance(outcome, H3Error) and outcome.code == "UNAVAILABLE"
        urls = launcher_urls(log, count=2)
        assert re.search(rf"the h3_vae process \(pid {vae}\) is gone: restarting tritonserver", log.read_text())
        assert sample(metrics_text(urls["metrics"]), "h3_active_requests") == 0
        assert client.generate("after the restart", num_inference_steps=2)[0].info["num_frames"] == 22
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def test_without_supervise_a_dead_h3_vae_stops_the_server_so_its_clients_get_an_error(tmp_path):
    launcher, log, _, outcome, vae = kill_h3_vae_mid_decode(tmp_path)
    try:
        # before: the server went on without h3_vae and the client got nothing
        assert isinstance(outcome, H3Error) and outcome.code == "UNAVAILABLE"
        assert launcher.wait(60) == 1
        stopping = f"the h3_vae process (pid {vae}) is gone: stopping tritonserver (--supervise restarts it instead)"
        assert stopping in log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
