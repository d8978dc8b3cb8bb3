"""Served benchmarks through tritonserver (issues 7 and 16: (c), (d), (f)), with the in-process loop beside.

    PYTHONUNBUFFERED=1 python benchmarks/served_bench.py --out DIR [--scenarios c c1 d f] [--work DIR]
        [--budget-s S] [--h3-dit KEY=VALUE ...]

Each server start writes a model repository with its h3_dit settings (server.repository.plan and
write_repository; on CUDA every model on GPU 0; the shipped defaults for everything not named
here, execute_budget_s included), starts tritonserver on free ports (server.process.TritonServer;
h3_dit builds its DiT with load_engine, compiled on CUDA, and runs its warm-up step before it
answers ready), runs benchmarks/bench_client.py against it (one warm-up request of 2 steps first,
progress every step) and stops the server. Scenarios, run in this order:
  c:  4 requests at concurrency 4, 30 steps: execution_mode request against step mode with the
      reference's fifo packing and 4 slots (max_num_seqs), the pack holding all four requests
      (max_batch_rows 65,536); c_repeats interleaved pairs (request mode, then step mode; 3 on
      CUDA): step4_over_request_throughput_c is the median of the pairs' throughput ratios, with
      their min and max.
  c1: step mode, fifo, 1 slot, the same 4 requests: step1_over_request_throughput_c against the
      median request-mode throughput of this call (c1 runs a request-mode run of its own, first,
      when c is not in the same call).
  d:  10 requests arriving every 5 s (unlimited concurrency), 20 steps: step mode with the
      policies request, fifo and srpt (the default; row_budget 4,096, where the H200 packing
      curve (e) turns compute-bound); mean latency and time to first step against `request`.
  f:  one server in step mode with the default policy, two clients one after the other: one
      request of the setting's shape (16,384 rows on CUDA) and steps, then one 32x32,
      22-frame request (128 rows with the 45-token prompt, and with the 11-token one) of
      f_small_steps steps; then, after the server has stopped, the same two requests' step
      loops in-process (load_engine as h3_dit builds it, then Engine.denoise_step +
      Engine.update, what h3_dit runs per step; no Triton) with
      torch's default CPU threads, with 1 (h3_dit's cpu_threads) and synchronised after every
      step (as the server's finiteness read does). Served step = the client's (progress response
      of the last step - that of the first) / (steps - 1). server_overhead_fraction_f = served /
      in-process (default threads) - 1 at the large shape; server_overhead_ms_128 = served -
      in-process (default threads) in ms at 128 rows.
Every client run also records the /metrics deltas of h3_step_seconds and h3_pack_rows over it
(`dit_steps`: the server's own seconds and rows per step; the warm-up request's steps included).
--budget-s: before each server start (and before the in-process loops) the run is skipped, and
listed under "skipped", when the seconds spent so far plus the longest run so far would pass the
budget; every finished run is saved at once, so a call cut short keeps what it measured.
--h3-dit KEY=VALUE sets an h3_dit parameter in every run (e.g. execute_budget_s=0), recorded.
On CUDA: the `bench` DiT (bf16, seed-0 weights drawn on the GPU by h3_core.weights.checkpoint_setup),
672x384, 209 frames (16,384 rows), DiT and VAEs on the GPU, the benchmark text encoder of width
5120 (benchmarks/bench_text_encoder.py, on the CPU), return_mp4=false (no PyAV needed).
On the CPU the same code runs the `tiny` model with small counts as a smoke test (c_repeats 1).
Writes DIR/served_bench.json (settings, commands, every bench_client.py document, summary) and
DIR/timeline_<run>.png per client run; server logs and repository copies go under --work.

CPU smoke run (one to two minutes): .venv/bin/python benchmarks/served_bench.py --out out/served_bench
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from h3_core.diffusion.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model.dit import use_bitwise_cublas  # noqa: E402 - after the sys.path set-up above
from h3_core.serving.dit.scheduler import DEFAULT_POLICY  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.checkpoint_setup import create_checkpoint  # noqa: E402 - after the sys.path set-up above
from server.process import TritonServer, metric_samples, read_metrics  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_text_encoder import write_bench_text_encoder  # noqa: E402 - after the sys.path set-up above

TEXT_LEN = 45  # tokens of "Random prompt {i} for benchmarking diffusion models" with the bench encoder
# h3_dit settings of the GPU runs that pack 4 x 16,384-row requests of 672x384, 209 frames in one step
FULL_PACK_DIT = {
    "max_batch_rows": 65536,
    "max_num_seqs": 4,
    "row_budget": 65536,
    "max_height": 384,
    "max_width": 672,
    "max_num_frames": 209,
    "max_request_mb": 1 << 20,
}
SCENARIOS = ("c", "c1", "d", "f")


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
    c_repeats: int = 3
    text_len: int = TEXT_LEN  # prompt tokens with the setting's encoder: the in-process loops use as many
    # (height, width, num_frames): 128 rows with 45 (or 11) tokens; a 17n+5 length, served as asked
    f_small: tuple[int, int, int] = (32, 32, 22)
    f_small_steps: int = 50


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
    d_interval_s=0.3,
    d_steps=3,
    max_batch_rows=4096,
    row_budget_d=4096,
    c_repeats=1,
    text_len=11,  # the default MiniLM's tokens of the prompt
    f_small_steps=5,
)


@dataclass(frozen=True)
class Client:
    """One bench_client.py run against a started server: its name (label, timeline, JSON key),
    request shape and the rest of its arguments."""

    name: str
    shape: tuple[int, int, int]  # height, width, num_frames
    args: list[str] = field(default_factory=list)


def prepare_weights(setting: Setting, work: Path, cuda: bool) -> tuple[Path, str]:
    """(checkpoint folder, h3_encoder encoder_path) for the setting: on CUDA a seed-0 `bench`
    checkpoint drawn on the GPU and the benchmark text encoder (both made once under work/);
    on the CPU the repository's seeded `tiny` checkpoint and the default MiniLM (""). The GPU
    draw builds the DiT with its default (bitwise) GEMM setting, which wants
    CUBLAS_WORKSPACE_CONFIG=:0:0 (use_bitwise_cublas): it is set for the draw only (no GEMM runs
    in it), so the servers started later get this process's environment as it was (h3_dit sets
    it for itself; the encoder and VAE processes run as they do when served)."""
    if not cuda:
        return ROOT / "checkpoints" / setting.config, ""
    checkpoint = work / "checkpoints" / setting.config
    start = time.perf_counter()
    previous = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    use_bitwise_cublas()
    try:
        made = create_checkpoint(setting.config, checkpoint, device="cuda")
    finally:
        if previous is None:
            del os.environ["CUBLAS_WORKSPACE_CONFIG"]
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = previous
    if made:
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


def timed_loop(
    engine, request: GenerationRequest, text: torch.Tensor, device: str, per_step_sync: bool = False
) -> float:
    """Mean seconds per step of `request` stepped alone (Engine.update(state,
    Engine.denoise_step([state]))) over all but its first 2 steps, which run untimed; the device
    synchronised before and after the timed steps, and after each one when per_step_sync."""
    state = engine.prepare(request, text)[0]
    for _ in range(2):
        engine.update(state, engine.denoise_step([state])[0])
    synchronize(device)
    start = time.perf_counter()
    while not state.finished:
        engine.update(state, engine.denoise_step([state])[0])
        if per_step_sync:
            synchronize(device)
    synchronize(device)
    return (time.perf_counter() - start) / (state.total_steps - 2)


def in_process_step_loops(setting: Setting, checkpoint: Path, loops: dict, device: str) -> dict:
    """Seconds per step of one request's loop in-process, per entry name -> ((height, width,
    num_frames), steps) of `loops`, on one engine built as h3_dit builds it (load_engine; on CUDA
    compiled, its warm-up step run first: warm_up_seconds): the mean over `steps` steps of
    Engine.update(state, Engine.denoise_step([state])) after 2 warm-up steps, the device
    synchronised before and after the timed steps (the latents stay on the device, so the steps
    in between queue without waiting); measured with torch's default CPU threads
    (seconds_per_step), then with 1 (seconds_per_step_1_thread), then with the default threads
    and the device synchronised after every step (seconds_per_step_synced). The request's text
    states are setting.text_len random rows (the served prompt's length), so `rows` matches the
    served request's."""
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
            max_steps=max(steps for _, steps in loops.values()) + 2,
            max_rows=2**20,
            max_request_mb=1 << 20,
        ),
    )
    warm_up_seconds = engine.warm_up()
    text = torch.randn(setting.text_len, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    results = {}
    for name, ((height, width, num_frames), steps) in loops.items():
        request = GenerationRequest("in-process", height, width, num_frames, steps + 2, seed=0)
        result = {"seconds_per_step": timed_loop(engine, request, text, device), "cpu_threads": threads}
        result["steps"] = steps
        torch.set_num_threads(1)
        result["seconds_per_step_1_thread"] = timed_loop(engine, request, text, device)
        torch.set_num_threads(threads)
        result["seconds_per_step_synced"] = timed_loop(engine, request, text, device, per_step_sync=True)
        result["rows"] = engine.prepare(request, text)[0].rows
        result["shape"] = [height, width, num_frames]
        result["warm_up_seconds"] = warm_up_seconds
        results[name] = result
    del engine  # its GPU memory goes back before empty_cache
    if device == "cuda":
        torch.cuda.empty_cache()
    return results


def without_machine_paths(document: dict, work: Path, out: Path, executable: str = sys.executable) -> dict:
    """`document` with this machine's folders written as $WORK and $OUT and the interpreter as
    python3, so that a result filed in the repository names no path of the machine it ran on."""
    text = json.dumps(document)
    for path, name in ((str(work), "$WORK"), (str(out), "$OUT"), (executable, "python3")):
        text = text.replace(json.dumps(path)[1:-1], name)
    return json.loads(text)


TRITON_TOTALS = (
    "nv_inference_exec_count",
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
SERVED_MODELS = ("h3_encoder", "h3_dit", "h3_vae")


def dit_totals(metrics_url: str) -> dict[str, float]:
    """h3_step_seconds and h3_pack_rows _sum and _count on /metrics, each summed over its series,
    and Triton's per-model execute counts and durations (TRITON_TOTALS) of each SERVED_MODELS
    model as `<model>.<metric>`, which say where a served step's time goes between executes."""
    text = read_metrics(metrics_url) or ""
    names = [f"h3_{metric}_{part}" for metric in ("step_seconds", "pack_rows") for part in ("sum", "count")]
    totals = {name: sum(s.value for s in metric_samples(text, name)) for name in names}
    for model in SERVED_MODELS:
        for name in TRITON_TOTALS:
            # prometheus_client's parser names a counter's samples <name>_total
            totals[f"{model}.{name}"] = sum(s.value for s in metric_samples(text, f"{name}_total", model=model))
    return totals


def served_run(
    server_name: str,
    setting: Setting,
    checkpoint: Path,
    encoder_path: str,
    dit: dict,
    clients: list[Client],
    work: Path,
    out: Path,
    cuda: bool,
    server_args: list[str],
) -> dict[str, dict]:
    """One server start, then one bench_client.py run per client, one after the other; returns
    client name -> its JSON document plus the settings, server_ready_s and dit_steps."""
    run_dir = work / server_name
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
    documents = {}
    start = time.perf_counter()
    with TritonServer(
        repository, free_ports=True, timeout=900, log_file=run_dir / "server.log", extra_args=server_args
    ) as server:
        ready_s = time.perf_counter() - start
        for client in clients:
            bench_json = run_dir / f"bench_{client.name}.json"
            height, width, num_frames = client.shape
            command = [
                sys.executable,
                "benchmarks/bench_client.py",
                "--url",
                server.grpc_url,
                "--metrics-url",
                server.metrics_url,
                "--height",
                str(height),
                "--width",
                str(width),
                "--num-frames",
                str(num_frames),
                "--warmup-requests",
                "1",
                "--warmup-steps",
                "2",
                "--no-mp4",
                "--label",
                client.name,
                "--output-json",
                str(bench_json),
                "--output-png",
                str(out / f"timeline_{client.name}.png"),
                *client.args,
            ]
            print(f"--- {client.name}: server ready in {ready_s:.1f} s; {' '.join(command[1:])}", flush=True)
            before = dit_totals(server.metrics_url)
            done = subprocess.run(command, cwd=ROOT)
            after = dit_totals(server.metrics_url)
            if done.returncode != 0:
                raise RuntimeError(
                    f"bench_client.py for {client.name} exited with {done.returncode}; "
                    f"server log {run_dir / 'server.log'}"
                )
            delta = {key: after[key] - before[key] for key in after}
            document = json.loads(bench_json.read_text())
            document["h3_dit"] = {
                "config_name": setting.config,
                "checkpoint_dir": str(checkpoint),
                "device": "cuda" if cuda else "cpu",
                **{k: str(v) for k, v in dit_params.items()},
            }
            document["server"] = server_name
            document["server_ready_s"] = ready_s
            steps, rows = delta["h3_step_seconds_count"], delta["h3_pack_rows_count"]
            document["dit_steps"] = {
                **delta,
                "steps": steps,
                "seconds_per_step": delta["h3_step_seconds_sum"] / steps if steps else None,
                "rows_per_step": delta["h3_pack_rows_sum"] / rows if rows else None,
            }
            documents[client.name] = without_machine_paths(document, work, out)
    return documents


def ratio_spread(ratios: list[float]) -> dict:
    """Median, min and max of ratios measured in interleaved runs (listed in run order)."""
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": list(ratios)}


def parse_dit_overrides(items: list[str]) -> dict[str, str]:
    """KEY=VALUE strings -> {KEY: VALUE} (argparse error text on a malformed one)."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--h3-dit {item!r} is not KEY=VALUE")
        overrides[key] = value
    return overrides


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
        choices=SCENARIOS,
        default=list(SCENARIOS),
        help="run in the order c, c1, d, f whatever the order given",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="skip a run when the seconds spent so far plus the longest run so far would pass this",
    )
    parser.add_argument(
        "--h3-dit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="h3_dit parameter for every run (repeatable), e.g. --h3-dit execute_budget_s=0",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra tritonserver argument (repeatable), e.g. --server-arg=--log-verbose=1",
    )
    args = parser.parse_args()
    try:
        dit_overrides = parse_dit_overrides(args.h3_dit)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    scenarios = [s for s in SCENARIOS if s in args.scenarios]
    began = time.perf_counter()
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
        + " ".join(scenarios)
        + (f" --budget-s {args.budget_s:g}" if args.budget_s is not None else "")
        + "".join(f" --h3-dit {item}" for item in args.h3_dit),
        "setting": setting.__dict__,
        "h3_dit_overrides": dit_overrides,
        "runs": {},
        "run_seconds": {},
        "skipped": [],
        "errors": {},
    }
    runs, summary, run_seconds = results["runs"], {}, results["run_seconds"]

    def save() -> None:  # after every run, so that a run cut short keeps what was measured
        results["summary"] = summary
        results["seconds"] = time.perf_counter() - began
        (args.out / "served_bench.json").write_text(json.dumps(results, indent=2) + "\n")

    def fits(name: str) -> bool:
        """Whether `name` may start within --budget-s (judged by the longest run so far)."""
        longest = max(run_seconds.values(), default=0.0)
        if args.budget_s is None or time.perf_counter() - began + longest <= args.budget_s:
            return True
        print(f"--- {name}: skipped, {time.perf_counter() - began:.0f} s + {longest:.0f} s > --budget-s", flush=True)
        results["skipped"].append(name)
        save()
        return False

    def serve(server_name: str, dit: dict, clients: list[Client]) -> dict[str, dict] | None:
        """Start one server for `clients`; their summaries (the documents go to runs), or None
        when skipped or failed (the error is recorded under "errors" and the call goes on)."""
        if not fits(server_name):
            return None
        start = time.perf_counter()
        try:
            documents = served_run(
                server_name,
                setting,
                checkpoint,
                encoder_path,
                {**dit, **dit_overrides},
                clients,
                args.work,
                args.out,
                cuda,
                args.server_arg,
            )
        except Exception as error:  # noqa: BLE001 - one failed run must not cost the rest of the call
            documents = None
            results["errors"][server_name] = f"{type(error).__name__}: {error}"
            print(f"--- {server_name}: failed: {results['errors'][server_name]}", flush=True)
        run_seconds[server_name] = time.perf_counter() - start
        if documents is not None:
            runs.update(documents)
        save()
        return None if documents is None else {name: document["summary"] for name, document in documents.items()}

    def run(name: str, dit: dict, bench_args: list[str]) -> dict | None:
        """One server with one client of the setting's shape; its summary (None when skipped)."""
        done = serve(name, dit, [Client(name, (setting.height, setting.width, setting.num_frames), bench_args)])
        return None if done is None else done[name]

    def throughput(summary_of_run: dict | None) -> float | None:
        return None if summary_of_run is None else summary_of_run["throughput_req_per_min"]

    n = setting.c_requests
    c_args = ["--num-prompts", str(n), "--max-concurrency", str(n), "--steps", str(setting.c_steps)]
    c_request = {"execution_mode": "request", "scheduling_policy": "fifo", "max_num_seqs": n}
    request_throughputs = []
    if "c" in scenarios:  # interleaved pairs: request mode, then step mode with n slots
        pairs = []
        for repeat in range(1, setting.c_repeats + 1):
            request = throughput(run(f"c_request_mode_{repeat}", c_request, c_args))
            packed = throughput(
                run(
                    f"c_step_{n}_slots_{repeat}",
                    {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": n},
                    c_args,
                )
            )
            if request is not None:
                request_throughputs.append(request)
            if request is not None and packed is not None:
                pairs.append(packed / request)
                spread = ratio_spread(pairs)
                results["c_step4_over_request_pairs"] = spread
                summary["step4_over_request_throughput_c"] = spread["median"]
                summary["step4_over_request_throughput_c_min"] = spread["min"]
                summary["step4_over_request_throughput_c_max"] = spread["max"]
                summary["step4_over_request_throughput_c_pairs"] = len(pairs)
                save()
    if "c1" in scenarios:
        if "c" not in scenarios:
            request = throughput(run("c_request_mode_c1", c_request, c_args))
            if request is not None:
                request_throughputs.append(request)
        one = throughput(
            run("c_step_1_slot", {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": 1}, c_args)
        )
        if one is not None and request_throughputs:
            summary["step1_over_request_throughput_c"] = one / statistics.median(request_throughputs)
            save()
    if "d" in scenarios:
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
            if d["request"] is None or d[policy] is None:
                continue
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
    if "f" in scenarios:
        large = (setting.height, setting.width, setting.num_frames)
        served = serve(
            "f_served",
            {
                "execution_mode": "step",
                "scheduling_policy": DEFAULT_POLICY,
                "max_num_seqs": 4,
                "row_budget": setting.row_budget_d,
            },
            [
                Client("f_served", large, ["--num-prompts", "1", "--steps", str(setting.c_steps)]),
                Client("f_served_128", setting.f_small, ["--num-prompts", "1", "--steps", str(setting.f_small_steps)]),
            ],
        )
        # in-process after the servers have stopped, so that nothing else holds the GPU
        loops = None
        if served is not None and fits("in_process"):
            start = time.perf_counter()
            try:
                loops = in_process_step_loops(
                    setting,
                    checkpoint,
                    {"large": (large, setting.c_steps), "128": (setting.f_small, setting.f_small_steps)},
                    "cuda" if cuda else "cpu",
                )
            except Exception as error:  # noqa: BLE001 - recorded; what was measured is still written
                results["errors"]["in_process"] = f"{type(error).__name__}: {error}"
                print(f"--- in_process: failed: {results['errors']['in_process']}", flush=True)
            run_seconds["in_process"] = time.perf_counter() - start
        if loops is not None:
            for key, client in (("in_process", "f_served"), ("in_process_128", "f_served_128")):
                loop = loops["large" if key == "in_process" else "128"]
                loop["served_seconds_per_step"] = served[client]["step_interval_s"]["mean"]
                loop["served_rows_per_step"] = runs[client]["dit_steps"]["rows_per_step"]
                results[key] = loop
            large_loop, small_loop = results["in_process"], results["in_process_128"]
            summary["server_overhead_fraction_f"] = (
                large_loop["served_seconds_per_step"] / large_loop["seconds_per_step"] - 1
            )
            summary["server_overhead_ms_128"] = (
                small_loop["served_seconds_per_step"] - small_loop["seconds_per_step"]
            ) * 1e3
            summary["server_overhead_fraction_f_128"] = (
                small_loop["served_seconds_per_step"] / small_loop["seconds_per_step"] - 1
            )
    save()

    print(
        f"\n{results['hardware']}, {setting.config} DiT, {setting.height}x{setting.width}, {setting.num_frames} frames"
    )
    print(
        f"{'run':<20}{'wall s':>9}{'req/min':>9}{'mean lat s':>11}{'p95 lat s':>10}{'mean TTFS s':>12}"
        f"{'step int s':>11}{'pack':>5}{'srv step s':>11}{'rows/step':>10}{'ready s':>8}"
    )
    for name, document in runs.items():
        s, dit_steps = document["summary"], document["dit_steps"]
        print(
            f"{name:<20}{s['wall_s']:9.2f}{s['throughput_req_per_min']:9.2f}{s['latency_s']['mean']:11.2f}"
            f"{s['latency_s']['p95']:10.2f}{s['time_to_first_step_s']['mean']:12.3f}"
            f"{s['step_interval_s']['mean'] or 0:11.4f}{s['peak_pack_size'] or 0:5d}"
            f"{dit_steps['seconds_per_step'] or 0:11.4f}{dit_steps['rows_per_step'] or 0:10.0f}"
            f"{document['server_ready_s']:8.1f}"
        )
    for key in ("in_process", "in_process_128"):
        if key in results:
            ip = results[key]
            print(
                f"{key}: {ip['rows']} rows, in-process step {ip['seconds_per_step'] * 1e3:.2f} ms "
                f"({ip['cpu_threads']} CPU threads), {ip['seconds_per_step_1_thread'] * 1e3:.2f} ms (1 thread), "
                f"{ip['seconds_per_step_synced'] * 1e3:.2f} ms (synchronised every step); served step "
                f"{ip['served_seconds_per_step'] * 1e3:.2f} ms ({ip['served_rows_per_step']:.0f} rows)"
            )
    for name, seconds in run_seconds.items():
        print(f"{name:<20} {seconds:7.1f} s")
    print(f"total {results['seconds']:.1f} s; skipped {results['skipped'] or 'none'}")
    for key, value in summary.items():
        print(f"{key:<44}{value:.4f}")
    if results["errors"]:
        sys.exit(f"failed runs: {results['errors']}")


if __name__ == "__main__":
    main()
