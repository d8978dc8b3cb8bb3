# h3-triton in a container: the same Python packages, tritonserver 2.51 (the nvidia-pytriton
# wheel's), python backend stub and launcher as `make test` uses (scripts/setup.sh), so the image
# runs what the tests run. Docker is not run in CI; tests/test_dockerfile.py checks this file
# (hadolint, the pins against requirements.txt, the command).
#   Build: docker build -t h3-triton .
#   GPUs:  docker run --gpus all --shm-size 1g -p 8000-8002:8000-8002 h3-triton
#   CPU:   docker run --shm-size 1g -p 8000-8002:8000-8002 h3-triton
# Without GPUs it serves the trained demo model on the CPU; with them, the same model with one
# h3_dit instance per GPU (server.repository sizes the repository at start). The official
# MiniMax-H3 checkpoint, its folder mounted read-only at /weights (its VAE folders are remote code:
# trust_remote_code opts in), the writer's placement and sizing printed at start
# (docs/deploy_h200.md; add --set h3_dit.quantization=fp8 for fp8):
#   docker run --gpus all --shm-size 1g -p 8000-8002:8000-8002 -v /data/MiniMax-H3:/weights:ro h3-triton \
#       python -m server.launch --host 0.0.0.0 --exit-timeout 3 --device cuda --gpus all --config h3 \
#       --checkpoint /weights --set h3_vae.trust_remote_code=true
#
# Python 3.11, as on the development machines (glibc 2.36 >= the 2.35 tritonserver needs). No
# CUDA base image: PyTorch's wheels bring their CUDA libraries, the pytriton wheel its libcudart,
# and the NVIDIA container toolkit the host's driver (compute and utility: NVML for GPU metrics).
FROM python:3.11-slim-bookworm

ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/h3-triton
# The python backend stub runs the first python3 on PATH: the venv's (server.environment).
ENV PATH=/opt/h3-triton/.venv/bin:$PATH
COPY requirements.txt ./
RUN python3 -m venv .venv \
 && pip install --no-cache-dir torch==2.13.0 \
 && pip install --no-cache-dir -r requirements.txt

COPY pyproject.toml ./
COPY h3_core h3_core
COPY server server
COPY client client
COPY videos_api videos_api
COPY model_repository model_repository
COPY weights weights
# The project importable inside the stub (a .pth: the stub ignores PYTHONPATH), the stub for this
# Python and the libpython link put in place now (the launcher would write them into
# site-packages, which the unprivileged user cannot), the seeded tiny checkpoint of
# model_repository/, and that user.
RUN pip install --no-cache-dir --no-deps -e . --config-settings editable_mode=compat \
 && python -c "from server.environment import ensure_python_stub as stub, libpython_dir; stub(); libpython_dir()" \
 && python -m h3_core.weights.checkpoint_setup --configs tiny \
 && groupadd --gid 1000 h3 \
 && useradd --create-home --uid 1000 --gid 1000 h3
USER 1000:1000

EXPOSE 8000 8001 8002
# Ready (/v2/health/ready) and the DiT's heartbeat not stalled (h3_heartbeat_timestamp_seconds):
# server.health. The start period covers the repository's sizing and the models' loading.
HEALTHCHECK --interval=30s --timeout=10s --start-period=300s --retries=3 CMD ["python", "-m", "server.health"]
# The launcher, not tritonserver itself: it writes the repository for what the container finds
# (--device auto: every GPU when torch sees one, else the CPU) and drains the DiT on SIGTERM.
# --host 0.0.0.0 on purpose: inside the container the endpoints must be reachable through the
# published ports (the launcher's default, 127.0.0.1, would be unreachable from outside).
# --exit-timeout 3: `docker stop` sends SIGTERM and kills after 10 s (its default grace); the
# DiT's drain takes at most 5 s (server.process.DRAIN_TIMEOUT_S) and tritonserver then exits
# within 3 s, so a stop with no clip decoding ends in 8 s, before the kill. Clips decoding at the
# stop are waited for (docs/operations.md §"Reliability"): give `docker stop -t` their decode time.
CMD ["python", "-m", "server.launch", "--host", "0.0.0.0", "--exit-timeout", "3", \
     "--device", "auto", "--config", "demo", "--checkpoint", "weights/demo"]
