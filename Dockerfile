# h3-triton on Triton 2.51 (NGC 24.10). Not built in CI (no docker there); it mirrors
# scripts/setup.sh, which is what the tests run. Build: docker build -t h3-triton .
# Run:   docker run --gpus all --shm-size 1g -p 8000-8002:8000-8002 h3-triton
FROM nvcr.io/nvidia/tritonserver:24.10-py3

# The image's Python is 3.10 (Ubuntu 22.04) and so is its python backend stub, but the pins in
# requirements.txt (transformers 5.24, av 18.1, matplotlib 3.11) need Python >= 3.11. So: a
# Python 3.11 venv, and the 3.11 stub from the nvidia-pytriton 0.7.0 wheel (the same 2.51 python
# backend), kept in the wheel's layout so its RPATH ($ORIGIN/../../../../nvidia_pytriton.libs)
# finds its libcudart.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv libpython3.11 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/h3-triton
# The stub runs the first python3 on PATH: the venv's.
ENV PATH=/opt/h3-triton/.venv/bin:$PATH
COPY requirements.txt ./
RUN python3.11 -m venv .venv \
 && pip install --no-cache-dir torch==2.13.0 \
 && grep -v '^nvidia-pytriton' requirements.txt > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip download --no-cache-dir --no-deps -d /tmp/pytriton nvidia-pytriton==0.7.0 \
 && python -c "import glob, zipfile; z = zipfile.ZipFile(glob.glob('/tmp/pytriton/*.whl')[0]); \
[z.extract(n, '/opt/pytriton-stub') for n in z.namelist() if n.startswith(('nvidia_pytriton.libs/libcudart', \
'pytriton/tritonserver/python_backend_stubs/3.11/'))]" \
 && STUB=/opt/pytriton-stub/pytriton/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub \
 && chmod 755 "$STUB" \
 && mv /opt/tritonserver/backends/python/triton_python_backend_stub /opt/tritonserver/backends/python/triton_python_backend_stub.py310 \
 && ln -s "$STUB" /opt/tritonserver/backends/python/triton_python_backend_stub \
 && rm -rf /tmp/pytriton /tmp/requirements.txt

COPY pyproject.toml ./
COPY h3_core h3_core
COPY server server
COPY client client
COPY model_repository model_repository
# the project importable inside the stub, then the seeded weights under checkpoints/
RUN pip install --no-cache-dir --no-deps -e . --config-settings editable_mode=compat \
 && python -m h3_core.checkpoint_setup

EXPOSE 8000 8001 8002
CMD ["tritonserver", "--model-repository", "/opt/h3-triton/model_repository", "--disable-auto-complete-config"]
