"""deploy/k8s/components/videos-api in the overlays that include it (cpu-demo-videos-api,
gpu-videos-api), rendered by kubectl and checked without a cluster: the Kubernetes 1.32 schemas,
the front end's command line as its own parser reads it, and that its ports, volume, keys and
Triton address meet the objects they name."""

import kubernetes_validate
import pytest

from client.api import check_url
from videos_api.__main__ import _parser

from .test_k8s import KUBERNETES_VERSION, render

OVERLAYS = {"cpu-demo-videos-api": ("cpu-demo", "h3-demo"), "gpu-videos-api": ("gpu", "h3")}
ADDED = [
    ("Deployment", "h3-videos-api"),
    ("NetworkPolicy", "h3-triton"),
    ("PersistentVolumeClaim", "h3-videos-api-data"),
    ("Service", "h3-videos-api"),
]


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request) -> tuple[str, dict]:
    """(overlay, {(kind, name): object})."""
    return request.param, {(doc["kind"], doc["metadata"]["name"]): doc for doc in render(request.param)}


def test_the_component_adds_only_its_objects_to_the_overlay(rendered):
    overlay, objects = rendered
    plain, namespace = OVERLAYS[overlay]
    without = {(doc["kind"], doc["metadata"]["name"]) for doc in render(plain)}
    assert sorted(set(objects) - without) == ADDED
    assert {objects[key]["metadata"]["namespace"] for key in ADDED} == {namespace}
    for key in ADDED:
        assert kubernetes_validate.validate(objects[key], KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_only_the_front_end_and_the_metrics_scraper_reach_tritons_ports(rendered):
    _, objects = rendered
    policy = objects["NetworkPolicy", "h3-triton"]["spec"]
    triton = objects["Deployment", "h3-triton"]["spec"]["template"]
    front_end = objects["Deployment", "h3-videos-api"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"] == triton["metadata"]["labels"] and policy["policyTypes"] == ["Ingress"]
    (container,) = triton["spec"]["containers"]
    assert {port["name"] for port in container["ports"]} == {"http", "grpc", "metrics"}
    api, scraper = policy["ingress"]
    assert api == {"from": [{"podSelector": {"matchLabels": front_end}}], "ports": [{"port": "http"}, {"port": "grpc"}]}
    assert scraper == {
        "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "ports": [{"port": "metrics"}],
    }


def test_the_front_end_reaches_every_server_and_keeps_its_data_on_its_volume(rendered):
    _, objects = rendered
    deployment = objects["Deployment", "h3-videos-api"]["spec"]
    assert (deployment["replicas"], deployment["strategy"]) == (1, {"type": "Recreate"})  # one SQLite writer
    spec = deployment["template"]["spec"]
    (container,) = spec["containers"]
    (server,) = objects["Deployment", "h3-triton"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == server["image"]
    assert container["command"][:3] == ["python", "-m", "videos_api"]
    args = _parser().parse_args(container["command"][3:])
    assert check_url(args.triton_url) == "dns:///h3-triton-headless:8001"
    headless = objects["Service", "h3-triton-headless"]["spec"]
    assert headless["clusterIP"] == "None" and {"name": "grpc", "port": 8001, "targetPort": "grpc"} in headless["ports"]
    (port,) = container["ports"]
    (service_port,) = objects["Service", "h3-videos-api"]["spec"]["ports"]
    assert (args.host, args.port, port["containerPort"]) == ("0.0.0.0", 8080, 8080)
    assert service_port["targetPort"] == port["name"] and container["readinessProbe"]["httpGet"]["port"] == port["name"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert str(args.data_dir) == mounts["data"]
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "h3-videos-api-data"
    assert args.api_key_file.parent.as_posix() == mounts["keys"]
    assert volumes["keys"]["secret"]["secretName"] == "h3-videos-api-keys"
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsUser"] == 1000
