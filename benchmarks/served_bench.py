"""Served benchmarks through tritonserver (issue 7 (c), (d), (f)), with the in-process loop beside.

    PYTHONUNBUFFERED=1 python benchmarks/served_bench.py --out DIR [--scenarios c d f] [--work DIR]

Each served run writes a model repository with its h3_dit settings (server.repository.plan and
write_repository; on CUDA every model on GPU 0), starts tritonserver on free ports
(server.process.TritonServer), runs benchmarks/bench_client.py against it (one warm-up request of
2 steps first, progress every step) and stops the server. Scenarios, run in this order:
  c: 4 requests at concurrency 4, 30 steps: execution_mode request, then step mode with the
     reference's fifo packing and 1 and 4 slots (max_num_seqs), the 4-slot pack holding all
     four requests (max_batch_rows 65,536); throughput ratios against request mode.
  d: 10 requests arriving every 5 s (unlimited concurrency), 20 steps: step mode with the
     policies request, fifo and srpt (the default; row_budget 4,096, where the H200 packing
     curve (e) turns compute-bound); mean latency and time to first step against `request`.
  f: the step loop of one request in-process (Engine.denoise_step + Engine.update, what h3_dit
     runs per step; no Triton), with torch's default CPU threads and with 1 (h3_dit's
     cpu_threads), against the same request served alone in step mode with the default policy:
     the client's step interval (progress response of the last step - that of the first) /
     (steps - 1). server_overhead_fraction_f = served / in-process (default threads) - 1.
On CUDA: the `bench` DiT (bf16, seed-0 weights drawn on the GPU by h3_core.checkpoint_setup),
672x384, 209 frames (16,384 rows), DiT and VAEs on the GPU, the benchmark text encoder of width
5120 (benchmarks/bench_text_encoder.py, on the CPU), return_mp4=false (no PyAV needed).
On the CPU the same code runs the `tiny` model with small counts as a smoke test. Writes
DIR/served_bench.json (settings, commands, every bench_client.py document, summary) and
DIR/timeline_<run>.png per run; server logs and repository copies go under --work.

CPU smoke run (about a minute): .venv/bin/python benchmarks/served_bench.py --out out/served_bench
"""

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from h3_core.checkpoint_setup import create_checkpoint  # noqa: E402 - after the sys.path set-up above
from h3_core.engine import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.scheduler import DEFAULT_POLICY  # noqa: E402 - after the sys.path set-up above
from server.process import TritonServer  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_text_encoder import write_bench_text_encoder  # noqa: E402 - after the sys.path set-up above

TEXT_LEN = 45  # tokens of "Random prompt {i} for benchmarking diffusion models" with the bench encoder


@dataclass(frozen=True)
class Setting:
    """Sizes of one benchmark setting (GPU or CPU smoke)."""

    config: str
    height: int
    width: int
    num_frames: int
    c_requests: int
    c_steps: int
    d_requests: int
    d_interval_s: float
    d_steps: int
    max_batch_rows: int
    row_budget_d: int


GPU = Setting(
    "bench",
    384,
    672,
    209,
    c_requests=4,
    c_steps=30,
    d_requests=10,
    d_interval_s=5.0,
    d_steps=20,
    max_batch_rows=65536,
    row_budget_d=4096,
)
CPU = Setting(
    "tiny",
    64,
    96,
    22,
    c_requests=2,
    c_steps=3,
    d_requests=3,
    d_interval_s=0.5,
    d_steps=3,
    max_batch_rows=4096,
    row_budget_d=4096,
)


def prepare_weights(setting: Setting, work: Path, cuda: bool) -> tuple[Path, str]:
    """(checkpoint folder, h3_encoder encoder_path) for the setting: on CUDA a seed-0 `bench`
    checkpoint drawn on the GPU and the benchmark text encoder (both made once under work/);
    on the CPU the repository's seeded `tiny` checkpoint and the default MiniLM ("")."""
    if not cuda:
        return ROOT / "checkpoints" / setting.config, ""
    checkpoint = work / "checkpoints" / setting.config
    start = time.perf_counter()
    if create_checkpoint(setting.config, checkpoint, device="cuda"):
        print(f"checkpoint {setting.config} written in {time.perf_counter() - start:.1f} s", flush=True)
    torch.cuda.empty_cache()  # the drawn DiT is gone; give its memory back to the servers
    encoder = work / "bench_text_encoder"
    if not (encoder / "model.safetensors").is_file():
        write_bench_text_encoder(encoder, width=5120)
    return checkpoint, str(encoder)


def synchronize(device: str) -> None:
    """Wait for the work queued on `device` ("cuda" or "cpu": nothing to wait for)."""
    if device == "cuda":
        torch.cuda.synchronize()


def in_process_step_loop(setting: Setting, checkpoint: Path, steps: int, device: str) -> dict:
    """Seconds per step of one request's loop in-process: the mean over `steps` steps of
    Engine.update(state, Engine.denoise_step([state])) after 2 warm-up steps, the device
    synchronised before and after the timed steps (the latents stay on the device, so the steps
    in between queue without waiting); measured with torch's default CPU threads
    (seconds_per_step), then with 1 (seconds_per_step_1_thread)."""
    engine = load_engine(
        setting.config,
        checkpoint,
        device,
        with_encoder=False,
        with_vaes=False,
        limits=RequestLimits(
            max_height=setting.height,
            max_width=setting.width,
            max_num_frames=setting.num_frames,
            max_rows=2**20,
            max_request_mb=1 << 20,
        ),
    )
    text = torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    request = GenerationRequest("in-process", setting.height, setting.width, setting.num_frames, steps + 2, seed=0)

    def loop(engine) -> float:
        state = engine.prepare(request, text)[0]
        for _ in range(2):
            engine.update(state, engine.denoise_step([state])[0])
        synchronize(device)
        start = time.perf_counter()
        while not state.finished:
            engine.update(state, engine.denoise_step([state])[0])
        synchronize(device)
        return (time.perf_counter() - start) / steps

    threads = torch.get_num_threads()
    result = {"seconds_per_step": loop(engine), "cpu_threads": threads, "steps": steps}
    torch.set_num_threads(1)
    result["seconds_per_step_1_thread"] = loop(engine)
    torch.set_num_threads(threads)
    del engine  # its GPU memory goes back before empty_cache
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def without_machine_paths(document: dict, work: Path, out: Path, executable: str = sys.executable) -> dict:
    """`document` with this machine's folders written as $WORK and $OUT and the interpreter as
    python3, so that a result filed in the repository names no path of the machine it ran on."""
    text = json.dumps(document)
    for path, name in ((str(work), "$WORK"), (str(out), "$OUT"), (executable, "python3")):
        text = text.replace(json.dumps(path)[1:-1], name)
    return json.loads(text)


def served_run(
    name: str,
    setting: Setting,
    checkpoint: Path,
    encoder_path: str,
    dit: dict,
    bench_args: list[str],
    work: Path,
    out: Path,
    cuda: bool,
    server_args: list[str],
) -> dict:
    """One server start + bench_client.py run; returns its JSON document plus the settings."""
    run_dir = work / name
    repository = run_dir / "model_repository"
    dit_params = {
        "max_height": setting.height,
        "max_width": setting.width,
        "max_num_frames": setting.num_frames,
        "max_batch_rows": setting.max_batch_rows,
        "max_request_mb": 1 << 20,
        **dit,
    }
    write_repository(
        repository,
        plan(
            setting.config,
            checkpoint,
            "cuda" if cuda else "cpu",
            [0] if cuda else [],
            overrides={"h3_dit": dit_params, "h3_encoder": {"encoder_path": encoder_path}},
        ),
    )
    bench_json = run_dir / "bench.json"
    start = time.perf_counter()
    with TritonServer(
        repository, free_ports=True, timeout=900, log_file=run_dir / "server.log", extra_args=server_args
    ) as server:
        ready_s = time.perf_counter() - start
        command = [
            sys.executable,
            "benchmarks/bench_client.py",
            "--url",
            server.grpc_url,
            "--metrics-url",
            server.metrics_url,
            "--height",
            str(setting.height),
            "--width",
            str(setting.width),
            "--num-frames",
            str(setting.num_frames),
            "--warmup-requests",
            "1",
            "--warmup-steps",
            "2",
            "--no-mp4",
            "--label",
            name,
            "--output-json",
            str(bench_json),
            "--output-png",
            str(out / f"timeline_{name}.png"),
            *bench_args,
        ]
        print(f"--- {name}: server ready in {ready_s:.1f} s; {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_client.py for {name} exited with {done.returncode}; server log {run_dir / 'server.log'}"
        )
    document = json.loads(bench_json.read_text())
    document["h3_dit"] = {
        "config_name": setting.config,
        "checkpoint_dir": str(checkpoint),
        "device": "cuda" if cuda else "cpu",
        **{k: str(v) for k, v in dit_params.items()},
    }
    document["server_ready_s"] = ready_s
    return without_machine_paths(document, work, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="served_bench.json and the timeline PNGs")
    parser.add_argument(
        "--work",
        type=Path,
        help="checkpoints, encoder, repository copies, server logs (default: a new temporary folder; "
        "give one to reuse the 12 GB bench checkpoint between calls)",
    )
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=("c", "d", "f"),
        default=["c", "d", "f"],
        help="run in the order c, d, f whatever the order given",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra tritonserver argument (repeatable), e.g. --server-arg=--log-verbose=1",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="h3_served_bench."))
    print(f"work folder {args.work}", flush=True)
    cuda = torch.cuda.is_available()
    setting = GPU if cuda else CPU
    checkpoint, encoder_path = prepare_weights(setting, args.work, cuda)
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name() if cuda else "CPU",
        "torch": torch.__version__,
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/served_bench.py --out DIR --scenarios "
        + " ".join(args.scenarios),
        "setting": setting.__dict__,
        "runs": {},
    }
    runs, summary = results["runs"], {}

    def save() -> None:  # after every run, so that a run cut short keeps what was measured
        results["summary"] = summary
        (args.out / "served_bench.json").write_text(json.dumps(results, indent=2) + "\n")

    def run(name: str, dit: dict, bench_args: list[str]) -> dict:
        runs[name] = served_run(
            name, setting, checkpoint, encoder_path, dit, bench_args, args.work, args.out, cuda, args.server_arg
        )
        save()
        return runs[name]["summary"]

    if "c" in args.scenarios:
        n = setting.c_requests
        c_args = ["--num-prompts", str(n), "--max-concurrency", str(n), "--steps", str(setting.c_steps)]
        request = run(
            "c_request_mode", {"execution_mode": "request", "scheduling_policy": "fifo", "max_num_seqs": n}, c_args
        )
        one = run("c_step_1_slot", {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": 1}, c_args)
        packed = run(
            f"c_step_{n}_slots", {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": n}, c_args
        )
        summary["step1_over_request_throughput_c"] = one["throughput_req_per_min"] / request["throughput_req_per_min"]
        summary["step4_over_request_throughput_c"] = (
            packed["throughput_req_per_min"] / request["throughput_req_per_min"]
        )
    if "d" in args.scenarios:
        d_args = [
            "--num-prompts",
            str(setting.d_requests),
            "--max-concurrency",
            "0",
            "--arrival-interval",
            str(setting.d_interval_s),
            "--steps",
            str(setting.d_steps),
        ]
        d = {
            policy: run(
                f"d_{policy}",
                {
                    "execution_mode": "step",
                    "scheduling_policy": policy,
                    "max_num_seqs": 4,
                    "row_budget": setting.row_budget_d,
                },
                d_args,
            )
            for policy in ("request", "fifo", "srpt")
        }
        for policy in ("fifo", "srpt"):
            name = "default" if policy == "srpt" else policy
            summary[f"{name}_over_request_mean_latency_d"] = (
                d[policy]["latency_s"]["mean"] / d["request"]["latency_s"]["mean"]
            )
            summary[f"request_over_{name}_time_to_first_step_d"] = (
                d["request"]["time_to_first_step_s"]["mean"] / d[policy]["time_to_first_step_s"]["mean"]
            )
            summary[f"{name}_over_request_throughput_d"] = (
                d[policy]["throughput_req_per_min"] / d["request"]["throughput_req_per_min"]
            )
    if "f" in args.scenarios:
        served = run(
            "f_served",
            {
                "execution_mode": "step",
                "scheduling_policy": DEFAULT_POLICY,
                "max_num_seqs": 4,
                "row_budget": setting.row_budget_d,
            },
            ["--num-prompts", "1", "--steps", str(setting.c_steps)],
        )
        # in-process after the servers have stopped, so that nothing else holds the GPU
        results["in_process"] = in_process_step_loop(setting, checkpoint, setting.c_steps, "cuda" if cuda else "cpu")
        results["in_process"]["served_seconds_per_step"] = served["step_interval_s"]["mean"]
        summary["server_overhead_fraction_f"] = (
            served["step_interval_s"]["mean"] / results["in_process"]["seconds_per_step"] - 1
        )
    save()

    print(
        f"\n{results['hardware']}, {setting.config} DiT, {setting.height}x{setting.width}, {setting.num_frames} frames"
    )
    print(
        f"{'run':<18}{'wall s':>9}{'req/min':>9}{'mean lat s':>11}{'p95 lat s':>10}{'mean TTFS s':>12}"
        f"{'step int s':>11}{'pack':>5}"
    )
    for name, document in runs.items():
        s = document["summary"]
        print(
            f"{name:<18}{s['wall_s']:9.2f}{s['throughput_req_per_min']:9.2f}{s['latency_s']['mean']:11.2f}"
            f"{s['latency_s']['p95']:10.2f}{s['time_to_first_step_s']['mean']:12.3f}"
            f"{s['step_interval_s']['mean'] or 0:11.4f}{s['peak_pack_size'] or 0:5d}"
        )
    if "in_process" in results:
        ip = results["in_process"]
        print(
            f"in-process step {ip['seconds_per_step'] * 1e3:.1f} ms ({ip['cpu_threads']} CPU threads), "
            f"{ip['seconds_per_step_1_thread'] * 1e3:.1f} ms (1 thread); served step "
            f"{ip['served_seconds_per_step'] * 1e3:.1f} ms"
        )
    for key, value in summary.items():
        print(f"{key:<44}{value:.4f}")


if __name__ == "__main__":
    main()
