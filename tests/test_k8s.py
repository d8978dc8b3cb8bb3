"""deploy/k8s rendered by the kubectl the machine ships (kustomize built in) and checked without a
cluster: every object of a built-in kind against the Kubernetes 1.32 schemas (kubernetes-validate),
the custom kinds listed (their rules go through promtool in tests/test_prometheus.py), and the
pod spec against what the server needs (the Dockerfile's command, the repository options,
/dev/shm, probes, drain and grace period). server.drain, the preStop hook, is tested here too."""

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from h3_core.config import get_config
from h3_core.serving.shared.settings import DitSettings
from server import deploy_plan, drain, sizing
from server.options import add_arguments
from server.process import DEFAULT_STALE_AFTER_S, DRAIN_TIMEOUT_S
from server.repository import parse_overrides, plan, request_rows

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu-demo", "gpu", "gpu-8")
KUBERNETES_VERSION = "1.32"
# Prometheus Operator kinds: kubernetes-validate has no schema for them
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule"}
KINDS = [
    "ConfigMap",
    "ConfigMap",
    "Deployment",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "PodMonitor",
    "PrometheusRule",
    "Service",
    "Service",
]


def kubectl() -> str:
    """The path of kubectl; fails the test, saying how to install it, when absent."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl not found on PATH: install kubectl 1.27 or newer (kustomize built in; "
            "https://kubernetes.io/docs/tasks/tools/), e.g. the kubectl package of Kubernetes' apt repository"
        )
    return path


def render(overlay: str) -> list[dict]:
    """The objects `kubectl kustomize deploy/k8s/overlays/<overlay>` prints."""
    run = subprocess.run([kubectl(), "kustomize", str(DEPLOY / "overlays" / overlay)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return [doc for doc in yaml.safe_load_all(run.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, dict]:
    """(overlay, {(kind, name): object})."""
    return request.param, {(doc["kind"], doc["metadata"]["name"]): doc for doc in render(request.param)}


def pod(objects: dict) -> dict:
    return objects["Deployment", "h3-triton"]["spec"]["template"]["spec"]


def options(objects: dict) -> list[str]:
    """The launcher's argv after `python -m server.launch`, as the container's shell expands it."""
    (container,) = pod(objects)["containers"]
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    (source,) = container["envFrom"]
    config = objects["ConfigMap", source["configMapRef"]["name"]]["data"]
    argv = shlex.split(script.replace("$H3_REPOSITORY_OPTIONS", config["H3_REPOSITORY_OPTIONS"]))
    assert argv[:4] == ["exec", "python", "-m", "server.launch"]
    return argv[4:]


def test_the_kubectl_is_the_one_the_machine_ships():
    run = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[0].startswith("Client Version: v1.32.")


def test_a_missing_kubectl_fails_with_how_to_install_it(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception) as failed:
        kubectl()
    assert str(failed.value).startswith("kubectl not found on PATH: install kubectl 1.27 or newer (kustomize built in;")


def test_each_overlay_renders_the_same_objects(rendered):
    overlay, objects = rendered
    assert sorted(kind for kind, _ in objects) == KINDS
    assert {doc["metadata"]["namespace"] for doc in objects.values()} == {"h3-demo" if overlay == "cpu-demo" else "h3"}


def test_built_in_kinds_validate_and_the_custom_ones_are_listed(rendered):
    _, objects = rendered
    unchecked = set()
    for (kind, name), doc in objects.items():
        try:
            assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
        except kubernetes_validate.SchemaNotFoundError:
            unchecked.add(kind)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{kind}/{name}: {error.message} at {'.'.join(map(str, error.path))}")
    assert unchecked == CUSTOM_KINDS


def test_a_schema_error_is_caught():
    (deployment,) = [doc for doc in render("cpu-demo") if doc["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "90"
    with pytest.raises(kubernetes_validate.ValidationError) as error:
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    assert error.value.message == "'90' is not of type 'integer', 'null'"


def test_the_command_is_the_dockerfiles_with_the_configmaps_options(rendered):
    _, objects = rendered
    docker = DockerfileParser(str(ROOT / "Dockerfile"))
    cmd = next(instruction["value"] for instruction in docker.structure if instruction["instruction"] == "CMD")
    cmd = yaml.safe_load(cmd)  # the exec form is a JSON list
    assert cmd[:3] == ["python", "-m", "server.launch"]
    assert options(objects)[:4] == cmd[3:7] == ["--host", "0.0.0.0", "--exit-timeout", "3"]


def test_the_base_options_are_the_dockerfiles():
    docker = DockerfileParser(str(ROOT / "Dockerfile"))
    cmd = yaml.safe_load(next(i["value"] for i in docker.structure if i["instruction"] == "CMD"))
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (generator,) = base["configMapGenerator"]
    (literal,) = generator["literals"]
    assert literal == "H3_REPOSITORY_OPTIONS=" + " ".join(cmd[7:])


def parsed_options(objects: dict) -> argparse.Namespace:
    """options() parsed: the repository options (server.options) and --host, --exit-timeout."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--host")
    parser.add_argument("--exit-timeout", type=int)
    return parser.parse_args(options(objects))


def test_the_repository_options_are_valid_and_shm_follows_their_canvas(rendered):
    """docs/reliability.md: /dev/shm about 3 x the largest FRAMES tensor, T x H x W x 3 bytes."""
    overlay, objects = rendered
    args = parsed_options(objects)
    overrides = parse_overrides(args.set)
    if overlay == "cpu-demo":  # the writer plans it here as the pod will
        dit = plan(args.config, str(ROOT / args.checkpoint), args.device, overrides=overrides).dit
    else:  # planned for the pod's H200s as `python -m server.repository --plan` plans them (docs/deploy_h200.md)
        assert (args.device, args.config, args.checkpoint, args.gpus) == ("cuda", "h3", "/weights", "all")
        (container,) = pod(objects)["containers"]
        gpus = list(range(container["resources"]["limits"]["nvidia.com/gpu"]))
        machine = sizing.Machine(16, dict.fromkeys(gpus, deploy_plan.H200_FREE_BYTES))
        repository = plan(
            "h3",
            "random:0",
            "cuda",
            gpus,
            overrides=overrides,
            machine=machine,
            text_encoder_bytes=deploy_plan.QWEN3VL_H3_BYTES,
        )
        dit = repository.dit
        # every instance takes the benchmarks' 16,384-row request (672 x 384 px, 209 frames)
        assert dit.max_batch_rows >= request_rows(get_config("h3")) == 16_384
        if overlay == "gpu":  # one H200 in bf16: the measured limit with the text encoder (docs/gpu_memory.md)
            assert (dit.max_batch_rows, repository.vae.decode_workers) == (32_768, 1)
        else:  # 8 H200s in bf16: the encoder and VAEs on GPU 7, a full h3_dit instance on each other
            assert repository.notes[0].startswith("placement own (chosen for 8 GPUs")
            assert (repository.groups["h3_dit"].gpus, repository.vae.device) == (tuple(range(7)), "cuda:7")
            assert dit.max_batch_rows == 65_536
    frames_bytes = dit.max_num_frames * dit.max_height * dit.max_width * 3
    (shm,) = [volume for volume in pod(objects)["volumes"] if volume["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    size = {"128Mi": 128 * 2**20, "512Mi": 512 * 2**20, "1Gi": 2**30}[shm["emptyDir"]["sizeLimit"]]
    assert 3 * frames_bytes <= size < 6 * frames_bytes, (overlay, frames_bytes)
    (container,) = pod(objects)["containers"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_probes_drain_and_grace(rendered):
    overlay, objects = rendered
    spec = pod(objects)
    (container,) = spec["containers"]
    assert container["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    health = ["python", "-m", "server.health", "--stale-after", str(int(DEFAULT_STALE_AFTER_S))]
    assert container["readinessProbe"]["exec"]["command"] == health
    assert container["livenessProbe"]["exec"]["command"] == health
    # an execute() lasts less than max_sequence_idle_microseconds as the writer sizes it (largest
    # pack, step mode): the probes call a heartbeat stale only at twice that
    args = parsed_options(objects)
    idle_us, _ = sizing.idle_timeout(
        args.device, "step", sizing.MAX_BATCH_ROWS, get_config(args.config).num_layers, DitSettings().max_steps
    )
    assert (idle_us, DEFAULT_STALE_AFTER_S) == (60_000_000, 120.0)
    assert container["livenessProbe"]["failureThreshold"] == 3
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[:4] == ["python", "-m", "server.drain", "--timeout"]
    drain_s = float(prestop[4])
    exit_timeout_s = args.exit_timeout
    assert spec["terminationGracePeriodSeconds"] > drain_s + DRAIN_TIMEOUT_S + exit_timeout_s
    assert (overlay, drain_s, spec["terminationGracePeriodSeconds"]) in (
        ("cpu-demo", 60, 90),
        ("gpu", 600, 630),
        ("gpu-8", 600, 630),
    )


def test_services_monitor_and_autoscaler_point_at_the_pods(rendered):
    overlay, objects = rendered
    (container,) = pod(objects)["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    labels = objects["Deployment", "h3-triton"]["spec"]["template"]["metadata"]["labels"]
    service, headless = objects["Service", "h3-triton"]["spec"], objects["Service", "h3-triton-headless"]["spec"]
    assert service["selector"] == headless["selector"] == labels
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [
        (8000, "http"),
        (8001, "grpc"),
        (8002, "metrics"),
    ]
    assert (headless["clusterIP"], [(p["port"], p["targetPort"]) for p in headless["ports"]]) == (
        "None",
        [(8001, "grpc")],
    )
    monitor = objects["PodMonitor", "h3-triton"]["spec"]
    assert monitor["selector"]["matchLabels"] == labels and monitor["podMetricsEndpoints"][0]["port"] == "metrics"
    assert objects["PodDisruptionBudget", "h3-triton"]["spec"]["selector"]["matchLabels"] == labels
    hpa = objects["HorizontalPodAutoscaler", "h3-triton"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "h3-triton"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, {"cpu-demo": 4, "gpu": 8, "gpu-8": 2}[overlay])
    dashboard = objects["ConfigMap", "h3-triton-dashboard"]
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert list(dashboard["data"]) == ["h3-triton-dashboard.json"]


def test_gpu_pods_get_a_gpu_and_the_weights(rendered):
    overlay, objects = rendered
    (container,) = pod(objects)["containers"]
    gpus = container["resources"]["limits"].get("nvidia.com/gpu")
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    if overlay != "cpu-demo":
        assert gpus == container["resources"]["requests"]["nvidia.com/gpu"] == {"gpu": 1, "gpu-8": 8}[overlay]
        assert "/weights" in mounts
        (weights,) = [volume for volume in pod(objects)["volumes"] if volume["name"] == "weights"]
        assert weights["persistentVolumeClaim"] == {"claimName": "h3-weights", "readOnly": True}
    else:
        assert gpus is None and mounts == {"/dev/shm"}


# -- server.drain (the preStop hook) ---------------------------------------------------------------

BUSY = """# TYPE h3_active_requests gauge
h3_active_requests{instance="h3_dit_0_0",model="h3_dit"} 2
h3_active_requests{instance="h3_dit_1_0",model="h3_dit"} 1
# TYPE h3_waiting_requests gauge
h3_waiting_requests{instance="h3_dit_0_0",model="h3_dit"} 3
h3_waiting_requests{instance="h3_dit_1_0",model="h3_dit"} 0
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="h3_dit",version="1"} 4
nv_inference_pending_request_count{model="h3_encoder",version="1"} 7
# TYPE h3_vae_decodes gauge
h3_vae_decodes{model="h3_vae",state="queued"} 5
h3_vae_decodes{model="h3_vae",state="running"} 2
# TYPE h3_vae_decodes_total counter
h3_vae_decodes_total{model="h3_vae"} 9
"""


def test_held_requests_counts_every_instance_tritons_backlog_and_the_decodes():
    # 2 + 1 + 3 + 0 + 4 + 5 + 2; the encoder's pending are not the DiT's, decodes done do not count
    assert drain.held_requests(BUSY) == 17
    idle_dit = BUSY.replace(" 2\n", " 0\n", 1).replace(" 1\n", " 0\n").replace(" 3\n", " 0\n")
    assert drain.held_requests(idle_dit.replace(" 4\n", " 0\n")) == 7  # only decodes: still held
    assert drain.held_requests("") == 0


def test_drain_returns_at_once_on_an_idle_server(server, capsys):
    assert drain.main(["--metrics", server.metrics_url, "--timeout", "5"]) == 0
    assert capsys.readouterr().err == "server.drain: the DiT holds no request and h3_vae no decode after 0 s\n"


def test_drain_gives_up_after_its_timeout(monkeypatch, capsys):
    monkeypatch.setattr(drain, "read_metrics", lambda url: BUSY)
    monkeypatch.setattr(drain, "POLL_S", 0.01)
    assert drain.main(["--metrics", "http://127.0.0.1:1/metrics", "--timeout", "0.05"]) == 1
    assert capsys.readouterr().err == "server.drain: the DiT and h3_vae still hold 17 requests after 0.05 s\n"


def test_drain_without_a_server(capsys):
    assert drain.main(["--metrics", "http://127.0.0.1:1/metrics", "--timeout", "5"]) == 0
    assert (
        capsys.readouterr().err == "server.drain: http://127.0.0.1:1/metrics does not answer: no server to wait for\n"
    )
