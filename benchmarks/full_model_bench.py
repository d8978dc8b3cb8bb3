"""The full-size H3 DiT served through tritonserver on one GPU, and the memory of its text encoder
beside it (issue 15; docs/gpu_memory.md).

    PYTHONUNBUFFERED=1 python3 benchmarks/full_model_bench.py --out DIR [--work DIR] [--stages a qwen3vl b]
        [--quantization none|fp8] [--encoder bench|qwen3vl]

One server serves every stage: a repository written with server.repository (plan + write_repository)
for the `h3` DiT (50 layers, 33,122,992,896 parameters, bf16) from the weight source `random:0`
(seeded random weights drawn on the GPU at load, no file: 66 GB do not fit the GPU host's disk;
the VAEs from the same source), everything on GPU 0, h3_dit's quantization as given (default none:
bf16; fp8: h3_core.model.fp8), h3_dit in step mode with max_num_seqs 4,
max_batch_rows = row_budget = 65,536 (four 16,384-row requests packed in one step), and the
text encoder `--encoder`:
  bench (default): the weight-free benchmark text encoder of width 5120
           (benchmarks/bench_text_encoder.py);
  qwen3vl: MiniMax-H3's own, served by h3_encoder on cuda:0 beside the DiT and encoding every
           request: a Qwen3-VL at its real sizes (QWEN3VL_H3 of h3_core.weights.official_checkpoint:
           the text decoder cut to 50 layers, hidden_layer 50, and transformers' default vision
           tower, 25.8 B parameters, 51.5 GB in bf16) from a config-only folder
           (write_weightless_qwen3vl) with encoder_weights random:0 (seeded random weights drawn
           on the GPU at load, no file); beside it h3_dit gets max_batch_rows = row_budget = 32,768
           in bf16 (two 16,384-row requests a step, docs/deploy_h200.md) and 65,536 in fp8, and
           h3_vae one decode worker. Stages a and b only (the probe below is not needed).
Its load time (tritonserver start -> ready) is recorded, then one unmeasured 2-step request of
the full shape warms it up, then, in this order:
  a:       one 672x384, 209-frame request (16,384 rows, docs/model.md §4.4) of 30 steps, end to end
           through benchmarks/bench_client.py;
  qwen3vl: with the server up (DiT resident, its allocator holding what run a used), the MiniMax-H3
           text encoder at its real size is built in a process of its own on cuda:0: transformers'
           Qwen3-VL text decoder (hidden 5120, 64 heads, 8 KV heads, head_dim 128, MLP 25600, vocab
           151,936, M-RoPE theta 5e6, sections [24, 20, 20] interleaved) cut to its first 50 decoder
           layers, final norm replaced by the identity (h3_core.model.encoder.load_qwen3vl), seeded
           random weights; its parameters and bytes, one encode each of a 9- and a 256-token prompt
           (random ids, all-ones mask; the median of 3 after a warm-up), and the device's used
           memory with DiT server + Qwen3-VL resident. The process ends before run b;
  b:       4 such requests at concurrency 4 (the reference's run: 2 x H100, TP2, 174.8 s wall).
For a and b: wall time and per-request latency and stage seconds (INFO stage_seconds: queue,
encode, denoise, decode; bench_client.py), seconds per step and packed rows
per step from the deltas of h3_step_seconds_sum / _count and h3_pack_rows_sum / _count on
/metrics, and the peak used memory of GPU 0 as a whole (nvidia-smi every 0.5 s while it runs)
and of each process on it (h3_dit_0_0, h3_vae_0_0, h3_encoder_0_0, tritonserver, this script).
MP4: the video comes back as a user gets it (return_mp4=true) when PyAV is importable here (the
server's python-backend stubs run in this interpreter's environment), else return_mp4=false, as
served_bench.py and multi_gpu_bench.py do on the GPU host, which has no PyAV; the JSON records
which (settings.return_mp4).

Writes DIR/full_model_bench.json after every stage (hardware, torch, command, date, settings,
every bench_client.py document, the Qwen3-VL measurement, summary), so that a run cut short keeps
what was measured, and DIR/timeline_run_a.png / _b.png where matplotlib is importable; prints a
table last. Server log, repository and encoder go under --work. Expected on one H200: about 7-8
minutes (load ~1 min, run a ~1 min at ~1.8-2.2 s a 16,384-row step, the Qwen3-VL ~0.5 min, run b
~4-4.5 min at 4x that); --stages a qwen3vl and --stages b split it over two calls. With
--encoder qwen3vl about 7 minutes too (load ~1.5 min; run b at two requests a step in bf16).
On a machine without CUDA the same code runs as a CPU smoke test (30-50 s): the `tiny` DiT,
96x64, 22 frames, 2 steps, a bench encoder of the tiny text width (384), a tiny 50-layer Qwen3-VL,
no GPU memory figures (null); --encoder qwen3vl serves a tiny 50-layer Qwen3-VL of width 384
(write_random_qwen3vl's sizes) the same way; tests/test_benchmarks_smoke.py runs both.
"""

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_text_encoder import write_bench_text_encoder  # noqa: E402 - after the sys.path set-up above
from client_runs import bench_client_command, dit_totals, without_machine_paths  # noqa: E402 - after the sys.path set-up above
from gpu_memory import GIB, MIB, PeakMemory, gib, gpu_memory_mib  # noqa: E402 - after the sys.path set-up above
from served_bench import FULL_PACK_DIT  # noqa: E402 - after the sys.path set-up above

from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.model import H3DiT  # noqa: E402 - after the sys.path set-up above
from h3_core.model.encoder import QWEN3VL_H3_LAYER  # noqa: E402 - after the sys.path set-up above
from h3_core.model.fp8 import QUANTIZATIONS  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.official_checkpoint import (  # noqa: E402 - after the sys.path set-up above
    QWEN3VL_H3,
    Qwen3VLDims,
    qwen3vl_config,
    tiny_qwen3vl,
    write_weightless_qwen3vl,
)
from server.process import TritonServer, stub_pids  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above
from server.sizing import dit_weight_bytes  # noqa: E402 - after the sys.path set-up above

WEIGHTS = "random:0"  # h3_core.weights.checkpoint: DiT init_weights(seed 0), VAEs create_vaes(1), drawn at load
REFERENCE_RUN_B_WALL_S = 174.8  # 2 x H100, TP2, 4 requests of 30 steps at concurrency 4 (docs/benchmarks.md)
SERVER_TIMEOUT_S = 900.0  # 33 B parameters drawn on the GPU at load
STAGES = ("a", "qwen3vl", "b")
ENCODE_TOKENS = (9, 256)
ENCODE_REPEATS = 3


# the CPU smoke's Qwen3-VL: write_random_qwen3vl's tiny sizes at the tiny DiT's text width, the same 50 layers
QWEN3VL_CPU = tiny_qwen3vl(get_config("tiny").text_dim, QWEN3VL_H3_LAYER)


@dataclass(frozen=True)
class Setting:
    """One benchmark setting (the GPU run or the CPU smoke)."""

    config: str
    device: str
    height: int
    width: int
    num_frames: int
    steps: int
    b_requests: int
    qwen3vl: str  # "h3" or "tiny": the Qwen3-VL's sizes (QWEN3VL_DIMS), probed or served


GPU = Setting("h3", "cuda", 384, 672, 209, steps=30, b_requests=4, qwen3vl="h3")
CPU = Setting("tiny", "cpu", 64, 96, 22, steps=2, b_requests=4, qwen3vl="tiny")
QWEN3VL_DIMS = {"h3": QWEN3VL_H3, "tiny": QWEN3VL_CPU}
ENCODER_STAGES = {"bench": ("a", "qwen3vl", "b"), "qwen3vl": ("a", "b")}  # --encoder -> its stages, in order
QWEN3VL_WEIGHTS = "random:0"  # h3_encoder's encoder_weights under --encoder qwen3vl: drawn on its device
# h3_dit's rows beside the served Qwen3-VL (docs/deploy_h200.md: 32,768 fit beside it in bf16: two
# 16,384-row requests a step; fp8's DiT is 17.9 GiB smaller and keeps the four of FULL_PACK_DIT)
QWEN3VL_ROWS = {"none": 32768, "fp8": 65536}


# ---- the Qwen3-VL text encoder at its real size (runs in a process of its own) --------------------


def build_qwen3vl_text(dims: Qwen3VLDims, device: str) -> torch.nn.Module:
    """The Qwen3-VL text decoder of `dims` (already cut: num_hidden_layers layers), built as
    h3_core.model.encoder.load_qwen3vl builds its language_model (from_config under the device, bf16, the
    final norm replaced by the identity: its last_hidden_state is the residual stream H3 reads),
    with transformers' own random initialisation instead of checkpoint tensors, in eval mode."""
    from transformers import AutoModel

    with torch.device(device):
        model = AutoModel.from_config(qwen3vl_config(dims).text_config, dtype=torch.bfloat16)
    model.norm = torch.nn.Identity()
    return model.eval()


def qwen3vl_probe(dims_name: str, device: str) -> dict:
    """Build the Qwen3-VL of QWEN3VL_DIMS[dims_name] on `device`, count it, time its encodes and
    read the device's used memory (module docstring, stage qwen3vl). An out-of-memory error is
    recorded under "error" (with the memory used before), not raised."""
    dims, cuda = QWEN3VL_DIMS[dims_name], device.startswith("cuda")

    def used() -> float | None:
        return gpu_memory_mib() if cuda else None

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    result = {"dims": asdict(dims), "device": device, "gpu_memory_used_mib_before": used()}
    torch.manual_seed(0)  # transformers' initialisation draws from the global generators
    start = time.perf_counter()
    try:
        model = build_qwen3vl_text(dims, device)
        synchronize()
        result["build_s"] = time.perf_counter() - start
        tensors = [*model.parameters(), *model.buffers()]
        result["model_class"] = type(model).__name__
        result["parameters"] = sum(p.numel() for p in model.parameters())
        result["parameters_expected"] = dims.parameters()
        result["bytes"] = sum(t.numel() * t.element_size() for t in tensors)
        result["dtype"] = str(next(model.parameters()).dtype)
        result["gpu_memory_used_mib_built"] = used()
        generator = torch.Generator().manual_seed(0)

        @torch.inference_mode()
        def encode(tokens: int) -> float:
            ids = torch.randint(0, dims.vocab_size, (1, tokens), generator=generator).to(device)
            synchronize()
            begin = time.perf_counter()
            states = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            synchronize()
            seconds = time.perf_counter() - begin
            if tuple(states.shape) != (1, tokens, dims.hidden_size):
                raise RuntimeError(f"states of shape {tuple(states.shape)} for {tokens} tokens")
            return seconds

        encode(ENCODE_TOKENS[0])  # warm-up: first-use kernel set-up
        for tokens in ENCODE_TOKENS:
            times = [encode(tokens) for _ in range(ENCODE_REPEATS)]
            result[f"encode_ms_{tokens}"] = statistics.median(times) * 1e3
            result[f"encode_ms_{tokens}_all"] = [t * 1e3 for t in times]
        result["gpu_memory_used_mib_encoded"] = used()
        if cuda:
            result["torch_max_memory_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
            result["torch_max_memory_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
    except torch.cuda.OutOfMemoryError as error:
        result["error"] = f"OutOfMemoryError after {time.perf_counter() - start:.1f} s: {error}"[:2000]
        result["gpu_memory_used_mib_at_error"] = used()
    return result


def run_qwen3vl_probe(setting: Setting, work: Path, cuda: bool, names: dict[int, str]) -> dict:
    """qwen3vl_probe in a process of its own (so that its memory and CUDA context are gone before
    run b), with GPU 0's peak used memory (whole device, and per process named by `names` and
    "qwen3vl_probe") sampled meanwhile; its result document, or one with "error" when the process
    failed."""
    result_path = work / "qwen3vl_probe.json"
    result_path.unlink(missing_ok=True)
    device = "cuda:0" if cuda else "cpu"
    command = [sys.executable, __file__, "--out", str(work), "--qwen3vl-probe", device, "--dims", setting.qwen3vl]
    start = time.perf_counter()
    with PeakMemory(cuda) as peak:
        probe = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, stderr = probe.communicate()
    seconds = time.perf_counter() - start
    if probe.returncode != 0 or not result_path.is_file():
        result = {"error": f"the probe exited with {probe.returncode}: {stderr[-2000:]}"}
    else:
        result = json.loads(result_path.read_text())
    result.update(
        process_s=seconds,
        peak_gpu_memory_mib=peak.peak_mib,
        peak_gpu_memory_mib_per_process=peak.per_process_peak_mib({**names, probe.pid: "qwen3vl_probe"}),
    )
    return result


# ---- the served runs -------------------------------------------------------------------------------


def encoder_overrides(encoder: str, setting: Setting, quantization: str, work: Path) -> dict[str, dict]:
    """The h3_dit, h3_encoder and h3_vae settings given to plan() for `encoder` (module docstring),
    writing its folder under `work` when it is not there: bench -> the weight-free bench text
    encoder of the DiT's text width; qwen3vl -> write_weightless_qwen3vl of QWEN3VL_DIMS[setting.qwen3vl]
    served with encoder_weights QWEN3VL_WEIGHTS at hidden_layer QWEN3VL_H3_LAYER, h3_dit's rows
    QWEN3VL_ROWS[quantization] and one decode worker."""
    dit = {**FULL_PACK_DIT, "quantization": quantization}
    if encoder == "bench":
        folder = work / "bench_text_encoder"
        if not (folder / "model.safetensors").is_file():
            write_bench_text_encoder(folder, width=get_config(setting.config).text_dim)
        return {"h3_dit": dit, "h3_encoder": {"encoder_path": str(folder)}}
    folder = work / f"qwen3vl_{setting.qwen3vl}"
    if not (folder / "config.json").is_file():
        write_weightless_qwen3vl(folder, QWEN3VL_DIMS[setting.qwen3vl])
    rows = QWEN3VL_ROWS[quantization]
    return {
        "h3_dit": {**dit, "max_batch_rows": rows, "row_budget": rows},
        "h3_encoder": {
            "encoder_path": str(folder),
            "encoder_weights": QWEN3VL_WEIGHTS,
            "hidden_layer": QWEN3VL_H3_LAYER,
        },
        "h3_vae": {"decode_workers": 1},
    }


def encoder_description(encoder: str, setting: Setting, text_dim: int, settings) -> dict:
    """What h3_encoder serves under `encoder`, for the JSON (its EncoderSettings `settings`)."""
    if encoder == "bench":
        return {
            "text_encoder": f"benchmark text encoder (benchmarks/bench_text_encoder.py), width {text_dim}",
            "device": settings.device,
        }
    dims = QWEN3VL_DIMS[setting.qwen3vl]
    return {
        "text_encoder": f"Qwen3-VL, {setting.qwen3vl} sizes (h3_core.weights.official_checkpoint), "
        f"config-only folder (write_weightless_qwen3vl), cut to {settings.hidden_layer} decoder layers",
        "dims": asdict(dims),
        "text_decoder_parameters": dims.parameters(),
        "encoder_weights": settings.encoder_weights,
        "hidden_layer": settings.hidden_layer,
        "device": settings.device,
    }


def stage_seconds(document: dict) -> list[dict | None]:
    """Each request's INFO stage_seconds (queue, encode, denoise, decode) of a bench_client.py
    document, in submission order."""
    return [r["stage_seconds"] for r in document["requests"]]


def per_process_gib(document: dict) -> dict[str, float]:
    """A run document's per-process peaks in GiB."""
    return {name: gib(mib) for name, mib in document["peak_gpu_memory_mib_per_process"].items()}


def bench(
    server: TritonServer,
    name: str,
    setting: Setting,
    requests: int,
    steps: int,
    mp4: bool,
    work: Path,
    out: Path,
    cuda: bool,
    names: dict[int, str],
) -> dict:
    """One bench_client.py run of `requests` full-shape requests of `steps` steps at concurrency
    `requests` (no warm-up inside): its JSON document plus `dit_steps` (the /metrics deltas over the
    run: steps, seconds_per_step, rows_per_step), peak_gpu_memory_mib (nvidia-smi, GPU 0 as a whole)
    and peak_gpu_memory_mib_per_process (keyed by `names`: pid -> model instance), exit_code.
    Raises RuntimeError when bench_client.py wrote no document."""
    output = work / f"bench_{name}.json"
    command = bench_client_command(
        server.grpc_url,
        metrics_url=server.metrics_url,
        shape=(setting.height, setting.width, setting.num_frames),
        steps=steps,
        num_prompts=requests,
        max_concurrency=requests,
        mp4=mp4,
        label=name,
        output_json=output,
    )
    if name != "warmup" and importlib.util.find_spec("matplotlib") is not None:  # the timeline PNG needs it
        command += ["--output-png", str(out / f"timeline_{name}.png")]
    print(f"--- {name}: {' '.join(command[1:])}", flush=True)
    output.unlink(missing_ok=True)
    before = dit_totals(server.metrics_url)
    with PeakMemory(cuda) as peak:
        done = subprocess.run(command, cwd=ROOT)
    after = dit_totals(server.metrics_url)
    if not output.is_file():  # nothing measured (the server did not answer ready, or bad flags)
        raise RuntimeError(
            f"bench_client.py for {name} exited with {done.returncode}; server log {work / 'server.log'}"
        )
    delta = {key: after[key] - before[key] for key in after}
    step_count = delta["h3_step_seconds_count"]
    document = json.loads(output.read_text())
    document["dit_steps"] = {
        **delta,
        "steps": step_count,
        "seconds_per_step": delta["h3_step_seconds_sum"] / step_count if step_count else None,
        "rows_per_step": delta["h3_pack_rows_sum"] / delta["h3_pack_rows_count"]
        if delta["h3_pack_rows_count"]
        else None,
    }
    document["exit_code"] = done.returncode  # 1: some request failed (summary: failed, error_codes)
    document["peak_gpu_memory_mib"] = peak.peak_mib
    document["peak_gpu_memory_samples"] = peak.samples
    document["peak_gpu_memory_mib_per_process"] = peak.per_process_peak_mib(names)
    return without_machine_paths(document, work, out)


def parse_args() -> argparse.Namespace:
    """The command line (module docstring); args.stages defaults to the encoder's stages, a stage
    the encoder has not is an error (none is checked for the --qwen3vl-probe process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="full_model_bench.json and the timeline PNGs")
    parser.add_argument("--work", type=Path, help="repository, server log, encoder (default: a temporary folder)")
    parser.add_argument(
        "--encoder",
        choices=sorted(ENCODER_STAGES),
        default="bench",
        help="h3_encoder's text encoder: bench (weight-free, default) or qwen3vl (MiniMax-H3's at its real sizes, "
        "50 layers, seeded random weights on GPU 0: every request really encoded)",
    )
    parser.add_argument(
        "--stages", nargs="+", choices=STAGES, help="run in the order a, qwen3vl, b (qwen3vl: --encoder bench only)"
    )
    parser.add_argument("--no-mp4", action="store_true", help="return_mp4=false even where PyAV is importable")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="none", help="h3_dit's (default none: bf16)")
    parser.add_argument("--qwen3vl-probe", metavar="DEVICE", help=argparse.SUPPRESS)  # the qwen3vl stage's process
    parser.add_argument("--dims", choices=sorted(QWEN3VL_DIMS), default="h3", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.qwen3vl_probe:
        return args
    valid = ENCODER_STAGES[args.encoder]
    args.stages = args.stages or list(valid)
    if not set(args.stages) <= set(valid):
        parser.error(
            f"--stages {' '.join(args.stages)}: with --encoder {args.encoder} choose from {', '.join(valid)}"
            + (" (the Qwen3-VL is served, no probe runs)" if args.encoder == "qwen3vl" else "")
        )
    return args


def results_document(
    args: argparse.Namespace, setting: Setting, stages: list[str], overrides: dict, repository, mp4: bool
) -> dict:
    """full_model_bench.json before any stage: the machine, the command, the settings (the DiT's
    parameters and weight bytes, each model's settings, return_mp4 and why), no runs yet."""
    cuda, cfg, valid = setting.device == "cuda", get_config(setting.config), ENCODER_STAGES[args.encoder]
    meta_dit_params = sum(p.numel() for p in H3DiT(cfg, device="meta").parameters())
    return {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(0) if cuda else "CPU",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/full_model_bench.py --out DIR"
        + ("" if args.encoder == "bench" else f" --encoder {args.encoder}")
        + ("" if stages == list(valid) else " --stages " + " ".join(stages))
        + ("" if args.quantization == "none" else f" --quantization {args.quantization}")
        + (" --no-mp4" if args.no_mp4 else ""),
        "settings": {
            **asdict(setting),
            "weights": WEIGHTS,
            "dit_parameters": meta_dit_params,
            "dit_weight_bytes": dit_weight_bytes(cfg, args.quantization),
            "rows_per_request": None,  # filled from run a's packed rows
            "h3_dit": {key: str(value) for key, value in overrides["h3_dit"].items()},
            "encoder": args.encoder,
            "h3_encoder": encoder_description(args.encoder, setting, cfg.text_dim, repository.encoder),
            "h3_vae": {
                "checkpoint_dir": repository.vae.checkpoint_dir,
                "device": repository.vae.device,
                "decode_workers": repository.vae.decode_workers,
            },
            "return_mp4": mp4,
            "return_mp4_why": "PyAV importable: the MP4 is encoded as a user gets it"
            if mp4
            else "no PyAV here (or --no-mp4): return_mp4=false, as served_bench.py / multi_gpu_bench.py",
            "server_timeout_s": SERVER_TIMEOUT_S,
            "gpu_memory_total_mib": gpu_memory_mib("memory.total") if cuda else None,
        },
        "runs": {},
        "errors": {},
    }


def main() -> int:
    """Run the stages asked for against one server; returns 1 when a stage failed, else 0."""
    args = parse_args()
    if args.qwen3vl_probe:
        result = qwen3vl_probe(args.dims, args.qwen3vl_probe)
        (args.out / "qwen3vl_probe.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    valid = ENCODER_STAGES[args.encoder]
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="h3_full_model."))
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {args.work}", flush=True)
    cuda = torch.cuda.is_available()
    setting = GPU if cuda else CPU
    mp4 = importlib.util.find_spec("av") is not None and not args.no_mp4
    stages = [stage for stage in valid if stage in args.stages]
    overrides = encoder_overrides(args.encoder, setting, args.quantization, args.work)
    repository = plan(setting.config, WEIGHTS, setting.device, [0] if cuda else [], overrides=overrides)
    for model, source in (("h3_dit", repository.dit.checkpoint_dir), ("h3_vae", repository.vae.checkpoint_dir)):
        if source != WEIGHTS:
            raise RuntimeError(f"{model} would load {source!r}, not {WEIGHTS}")
    results = results_document(args, setting, stages, overrides, repository, mp4)
    summary = {"reference_run_b_wall_s": REFERENCE_RUN_B_WALL_S}

    def save() -> None:  # after every stage, so that a run cut short keeps what was measured
        results["summary"] = summary
        (args.out / "full_model_bench.json").write_text(json.dumps(results, indent=2) + "\n")

    repository_dir = write_repository(args.work / "model_repository", repository)
    save()
    print(f"--- starting tritonserver: {setting.config} DiT from {WEIGHTS} on {setting.device}", flush=True)
    start = time.perf_counter()
    with TritonServer(
        repository_dir, free_ports=True, timeout=SERVER_TIMEOUT_S, log_file=args.work / "server.log"
    ) as server:
        summary["load_seconds"] = time.perf_counter() - start
        summary["gpu_memory_used_gib_loaded"] = gib(gpu_memory_mib()) if cuda else None
        print(f"--- server ready in {summary['load_seconds']:.1f} s", flush=True)
        names = {server.pid: "tritonserver", os.getpid(): "benchmark", **stub_pids(server.pid)}
        results["processes"] = sorted(names.values())
        save()
        runs, errors = results["runs"], results["errors"]

        def stage(name: str, body) -> None:
            """Run one stage; a failure is recorded under errors[name] and the next stage still runs."""
            try:
                body()
            except Exception as error:  # noqa: BLE001 - recorded in the JSON, the next stage still measures
                errors[name] = f"{type(error).__name__}: {error}"
                print(f"--- {name} failed: {errors[name]}", flush=True)
            save()

        def warmup() -> None:
            runs["warmup"] = bench(server, "warmup", setting, 1, 2, mp4, args.work, args.out, cuda, names)

        def run_a() -> None:
            a = runs["run_a"] = bench(server, "run_a", setting, 1, setting.steps, mp4, args.work, args.out, cuda, names)
            results["settings"]["rows_per_request"] = a["dit_steps"]["rows_per_step"]
            summary.update(
                run_a_wall_s=a["summary"]["wall_s"],
                run_a_latency_s=a["summary"]["latency_s"]["mean"],
                run_a_failed=a["summary"]["failed"],
                run_a_seconds_per_step=a["dit_steps"]["seconds_per_step"],
                run_a_rows_per_step=a["dit_steps"]["rows_per_step"],
                run_a_stage_seconds=stage_seconds(a),
                peak_gpu_memory_gib_a=gib(a["peak_gpu_memory_mib"]),
                peak_gpu_memory_gib_per_process_a=per_process_gib(a),
            )

        def qwen3vl() -> None:
            summary["gpu_memory_used_gib_dit_server"] = gib(gpu_memory_mib()) if cuda else None
            print(f"--- qwen3vl: the {setting.qwen3vl} Qwen3-VL text decoder beside the server", flush=True)
            q = results["qwen3vl"] = run_qwen3vl_probe(setting, args.work, cuda, names)
            if "error" in q:
                print(f"qwen3vl: {q['error']}", flush=True)
            with_both = [q.get("gpu_memory_used_mib_built"), q.get("gpu_memory_used_mib_encoded")]
            summary.update(
                qwen3vl_params=q.get("parameters"),
                qwen3vl_params_expected=QWEN3VL_DIMS[setting.qwen3vl].parameters(),
                qwen3vl_gib=q["bytes"] / GIB if "bytes" in q else None,
                qwen3vl_encode_ms_9=q.get("encode_ms_9"),
                qwen3vl_encode_ms_256=q.get("encode_ms_256"),
                gpu_memory_used_gib_dit_plus_qwen3vl=gib(max(with_both)) if None not in with_both else None,
                peak_gpu_memory_gib_qwen3vl=gib(q.get("peak_gpu_memory_mib")),
                qwen3vl_error=q.get("error"),
            )

        def run_b() -> None:
            b = runs["run_b"] = bench(
                server, "run_b", setting, setting.b_requests, setting.steps, mp4, args.work, args.out, cuda, names
            )
            summary.update(
                run_b_wall_s=b["summary"]["wall_s"],
                run_b_latency_s=b["summary"]["latency_s"]["mean"],
                run_b_failed=b["summary"]["failed"],
                run_b_seconds_per_step=b["dit_steps"]["seconds_per_step"],
                run_b_rows_per_step=b["dit_steps"]["rows_per_step"],
                run_b_stage_seconds=stage_seconds(b),
                peak_gpu_memory_gib_b=gib(b["peak_gpu_memory_mib"]),
                peak_gpu_memory_gib_per_process_b=per_process_gib(b),
                run_b_over_reference_wall=b["summary"]["wall_s"] / REFERENCE_RUN_B_WALL_S,
                gpu_memory_used_gib_server_idle_after_b=gib(gpu_memory_mib()) if cuda else None,
            )

        if "a" in stages or "b" in stages:
            stage("warmup", warmup)
        for name, body in (("a", run_a), ("qwen3vl", qwen3vl), ("b", run_b)):
            if name in stages:
                stage(name, body)
    save()
    print_table(results, setting)
    return 1 if results["errors"] else 0


def print_table(results: dict, setting: Setting) -> None:
    s, runs = results["summary"], results["runs"]

    def f(value, spec: str = ".2f") -> str:
        return "null" if value is None else format(value, spec)

    print(
        f"\n{results['hardware']}, {setting.config} DiT ({results['settings']['dit_parameters']:,} parameters) from "
        f"{WEIGHTS}, {setting.width}x{setting.height}, {setting.num_frames} frames, {setting.steps} steps, "
        f"return_mp4={str(results['settings']['return_mp4']).lower()}, text encoder "
        f"{results['settings']['encoder']}; server ready in {f(s.get('load_seconds'), '.1f')} s"
    )
    print(
        f"{'run':<8}{'req':>4}{'wall s':>9}{'mean lat s':>11}{'max lat s':>10}{'s/step':>9}{'rows/step':>11}"
        f"{'peak GiB':>10}"
    )
    for name in ("run_a", "run_b"):
        if name in runs:
            r = runs[name]
            latency = r["summary"]["latency_s"]
            print(
                f"{name:<8}{r['summary']['completed']:4d}{f(r['summary']['wall_s']):>9}"
                f"{f(latency['mean']):>11}{f(latency['max']):>10}"
                f"{f(r['dit_steps']['seconds_per_step'], '.3f'):>9}{f(r['dit_steps']['rows_per_step'], ',.0f'):>11}"
                f"{f(gib(r['peak_gpu_memory_mib'])):>10}"
            )
    for name in ("run_a", "run_b"):
        peaks = runs.get(name, {}).get("peak_gpu_memory_mib_per_process")
        if peaks:
            print(f"{name} peak GiB per process: " + ", ".join(f"{k} {gib(v):.2f}" for k, v in peaks.items()))
    for name in ("run_a", "run_b"):
        stages = [seconds for seconds in s.get(f"{name}_stage_seconds", []) if seconds]
        if stages:
            means = {key: statistics.mean(seconds.get(key, 0.0) for seconds in stages) for key in stages[0]}
            print(f"{name} mean stage s: " + ", ".join(f"{key} {value:.2f}" for key, value in means.items()))
    print(f"reference run b (2 x H100, TP2, request mode): {REFERENCE_RUN_B_WALL_S} s wall")
    if "qwen3vl_params" in s:
        print(
            f"Qwen3-VL text decoder, {QWEN3VL_H3_LAYER} layers ({setting.qwen3vl} dims): "
            f"{f(s['qwen3vl_params'], ',d')} parameters (expected {s['qwen3vl_params_expected']:,}), "
            f"{f(s['qwen3vl_gib'])} GiB; encode 9 tokens {f(s['qwen3vl_encode_ms_9'], '.1f')} ms, "
            f"256 tokens {f(s['qwen3vl_encode_ms_256'], '.1f')} ms; GPU 0 used: DiT server "
            f"{f(s['gpu_memory_used_gib_dit_server'])} GiB, "
            f"+ Qwen3-VL {f(s['gpu_memory_used_gib_dit_plus_qwen3vl'])} GiB"
            + (f"; ERROR {s['qwen3vl_error']}" if s.get("qwen3vl_error") else "")
        )
    for name, error in results["errors"].items():
        print(f"stage {name} FAILED: {error}")


if __name__ == "__main__":
    sys.exit(main())
