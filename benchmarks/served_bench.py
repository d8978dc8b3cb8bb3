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

from h3_core.model.dit import use_bitwise_cublas  # noqa: E402 - after the sys.path set-up above
from h3_core.serving.dit.scheduler import DEFAULT_POLICY  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.checkpoint_setup import create_checkpoint  # noqa: E402 - after the sys.path set-up above
from server.process import TritonServer  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_text_encoder import write_bench_text_encoder  # noqa: E402 - after the sys.path set-up above
from client_runs import bench_client_command, dit_totals, without_machine_paths  # noqa: E402 - after the sys.path set-up above
from in_process_steps import in_process_step_loops  # noqa: E402 - after the sys.path set-up above

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
            command = bench_client_command(
                server.grpc_url,
                metrics_url=server.metrics_url,
                shape=client.shape,
                warmup_requests=1,
                warmup_steps=2,
                label=client.name,
                output_json=bench_json,
                output_png=out / f"timeline_{client.name}.png",
                extra=client.args,
            )
            print(f"--- {client.name}: server ready in {ready_s:.1f} s; {' '.join(command[1:])}", flush=True)
            before = dit_totals(server.metrics_url, per_model=True)
            done = subprocess.run(command, cwd=ROOT)
            after = dit_totals(server.metrics_url, per_model=True)
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


def parse_args() -> argparse.Namespace:
    """The command line (module docstring); --h3-dit items parsed into args.dit_overrides."""
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
        args.dit_overrides = parse_dit_overrides(args.h3_dit)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    return args


class Campaign:
    """The runs of one call: the results document (saved to OUT/served_bench.json after every
    run, so that a run cut short keeps what was measured), the --budget-s check and the servers."""

    def __init__(self, args: argparse.Namespace, scenarios: list[str]) -> None:
        self.args, self.began = args, time.perf_counter()
        args.out.mkdir(parents=True, exist_ok=True)
        args.work = args.work or Path(tempfile.mkdtemp(prefix="h3_served_bench."))
        print(f"work folder {args.work}", flush=True)
        self.cuda = torch.cuda.is_available()
        self.setting = GPU if self.cuda else CPU
        self.checkpoint, self.encoder_path = prepare_weights(self.setting, args.work, self.cuda)
        self.results = {
            "date": datetime.date.today().isoformat(),
            "hardware": torch.cuda.get_device_name() if self.cuda else "CPU",
            "torch": torch.__version__,
            "command": "PYTHONUNBUFFERED=1 python3 benchmarks/served_bench.py --out DIR --scenarios "
            + " ".join(scenarios)
            + (f" --budget-s {args.budget_s:g}" if args.budget_s is not None else "")
            + "".join(f" --h3-dit {item}" for item in args.h3_dit),
            "setting": self.setting.__dict__,
            "h3_dit_overrides": args.dit_overrides,
            "runs": {},
            "run_seconds": {},
            "skipped": [],
            "errors": {},
        }
        self.runs, self.summary, self.run_seconds = self.results["runs"], {}, self.results["run_seconds"]

    def save(self) -> None:
        """Write the results so far."""
        self.results["summary"] = self.summary
        self.results["seconds"] = time.perf_counter() - self.began
        (self.args.out / "served_bench.json").write_text(json.dumps(self.results, indent=2) + "\n")

    def fits(self, name: str) -> bool:
        """Whether `name` may start within --budget-s (judged by the longest run so far)."""
        longest, spent = max(self.run_seconds.values(), default=0.0), time.perf_counter() - self.began
        if self.args.budget_s is None or spent + longest <= self.args.budget_s:
            return True
        print(f"--- {name}: skipped, {spent:.0f} s + {longest:.0f} s > --budget-s", flush=True)
        self.results["skipped"].append(name)
        self.save()
        return False

    def serve(self, server_name: str, dit: dict, clients: list[Client]) -> dict[str, dict] | None:
        """Start one server for `clients`; their summaries (the documents go to runs), or None
        when skipped or failed (the error is recorded under "errors" and the call goes on)."""
        if not self.fits(server_name):
            return None
        start, args = time.perf_counter(), self.args
        try:
            documents = served_run(
                server_name,
                self.setting,
                self.checkpoint,
                self.encoder_path,
                {**dit, **args.dit_overrides},
                clients,
                args.work,
                args.out,
                self.cuda,
                args.server_arg,
            )
        except Exception as error:  # noqa: BLE001 - one failed run must not cost the rest of the call
            documents = None
            self.results["errors"][server_name] = f"{type(error).__name__}: {error}"
            print(f"--- {server_name}: failed: {self.results['errors'][server_name]}", flush=True)
        self.run_seconds[server_name] = time.perf_counter() - start
        if documents is not None:
            self.runs.update(documents)
        self.save()
        return None if documents is None else {name: document["summary"] for name, document in documents.items()}

    def run(self, name: str, dit: dict, bench_args: list[str]) -> dict | None:
        """One server with one client of the setting's shape; its summary (None when skipped or
        failed)."""
        shape = (self.setting.height, self.setting.width, self.setting.num_frames)
        done = self.serve(name, dit, [Client(name, shape, bench_args)])
        return None if done is None else done[name]


def throughput(summary_of_run: dict | None) -> float | None:
    """A run's requests per minute, None for a run skipped or failed."""
    return None if summary_of_run is None else summary_of_run["throughput_req_per_min"]


def scenario_c(campaign: Campaign, paired: bool, one_slot: bool) -> None:
    """(c) paired: interleaved pairs of request mode and step mode with c_requests slots, their
    throughput ratio; one_slot: step mode with 1 slot against request mode (a request-mode run of
    its own when the pairs did not run)."""
    setting, summary, n = campaign.setting, campaign.summary, campaign.setting.c_requests
    c_args = ["--num-prompts", str(n), "--max-concurrency", str(n), "--steps", str(setting.c_steps)]
    c_request = {"execution_mode": "request", "scheduling_policy": "fifo", "max_num_seqs": n}
    request_throughputs, pairs = [], []
    for repeat in range(1, setting.c_repeats + 1) if paired else ():
        request = throughput(campaign.run(f"c_request_mode_{repeat}", c_request, c_args))
        step = {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": n}
        packed = throughput(campaign.run(f"c_step_{n}_slots_{repeat}", step, c_args))
        if request is not None:
            request_throughputs.append(request)
        if request is not None and packed is not None:
            pairs.append(packed / request)
            spread = ratio_spread(pairs)
            campaign.results["c_step4_over_request_pairs"] = spread
            summary["step4_over_request_throughput_c"] = spread["median"]
            summary["step4_over_request_throughput_c_min"] = spread["min"]
            summary["step4_over_request_throughput_c_max"] = spread["max"]
            summary["step4_over_request_throughput_c_pairs"] = len(pairs)
            campaign.save()
    if not one_slot:
        return
    if not paired:
        request = throughput(campaign.run("c_request_mode_c1", c_request, c_args))
        if request is not None:
            request_throughputs.append(request)
    one_slot_dit = {"execution_mode": "step", "scheduling_policy": "fifo", "max_num_seqs": 1}
    one = throughput(campaign.run("c_step_1_slot", one_slot_dit, c_args))
    if one is not None and request_throughputs:
        summary["step1_over_request_throughput_c"] = one / statistics.median(request_throughputs)
        campaign.save()


def scenario_d(campaign: Campaign) -> None:
    """(d) d_requests arriving every d_interval_s under request mode, fifo and srpt (the default):
    each policy's mean latency, time to first step and throughput against request mode."""
    setting, summary = campaign.setting, campaign.summary
    d_args = ["--num-prompts", str(setting.d_requests), "--max-concurrency", "0"]
    d_args += ["--arrival-interval", str(setting.d_interval_s), "--steps", str(setting.d_steps)]
    d = {
        policy: campaign.run(
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


def scenario_f(campaign: Campaign) -> None:
    """(f) one request served (the setting's shape, and f_small) against the same request's steps
    in-process after the server stopped: the server's overhead per step."""
    setting, results, summary = campaign.setting, campaign.results, campaign.summary
    large = (setting.height, setting.width, setting.num_frames)
    served = campaign.serve(
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
    if served is not None and campaign.fits("in_process"):
        start = time.perf_counter()
        try:
            loops = in_process_step_loops(
                setting,
                campaign.checkpoint,
                {"large": (large, setting.c_steps), "128": (setting.f_small, setting.f_small_steps)},
                "cuda" if campaign.cuda else "cpu",
            )
        except Exception as error:  # noqa: BLE001 - recorded; what was measured is still written
            results["errors"]["in_process"] = f"{type(error).__name__}: {error}"
            print(f"--- in_process: failed: {results['errors']['in_process']}", flush=True)
        campaign.run_seconds["in_process"] = time.perf_counter() - start
    if loops is None:
        return
    for key, client in (("in_process", "f_served"), ("in_process_128", "f_served_128")):
        loop = loops["large" if key == "in_process" else "128"]
        loop["served_seconds_per_step"] = served[client]["step_interval_s"]["mean"]
        loop["served_rows_per_step"] = campaign.runs[client]["dit_steps"]["rows_per_step"]
        results[key] = loop
    large_loop, small_loop = results["in_process"], results["in_process_128"]
    summary["server_overhead_fraction_f"] = large_loop["served_seconds_per_step"] / large_loop["seconds_per_step"] - 1
    summary["server_overhead_ms_128"] = (small_loop["served_seconds_per_step"] - small_loop["seconds_per_step"]) * 1e3
    summary["server_overhead_fraction_f_128"] = (
        small_loop["served_seconds_per_step"] / small_loop["seconds_per_step"] - 1
    )


def print_report(campaign: Campaign) -> None:
    """The runs' table, the in-process loops, each run's seconds and the summary, on stdout."""
    results, setting = campaign.results, campaign.setting
    print(
        f"\n{results['hardware']}, {setting.config} DiT, {setting.height}x{setting.width}, {setting.num_frames} frames"
    )
    print(
        f"{'run':<20}{'wall s':>9}{'req/min':>9}{'mean lat s':>11}{'p95 lat s':>10}{'mean TTFS s':>12}"
        f"{'step int s':>11}{'pack':>5}{'srv step s':>11}{'rows/step':>10}{'ready s':>8}"
    )
    for name, document in campaign.runs.items():
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
    for name, seconds in campaign.run_seconds.items():
        print(f"{name:<20} {seconds:7.1f} s")
    print(f"total {results['seconds']:.1f} s; skipped {results['skipped'] or 'none'}")
    for key, value in campaign.summary.items():
        print(f"{key:<44}{value:.4f}")


def main() -> None:
    """Run the scenarios asked for in the order c, c1, d, f; exit 1 naming the failed runs."""
    args = parse_args()
    scenarios = [s for s in SCENARIOS if s in args.scenarios]
    campaign = Campaign(args, scenarios)
    if "c" in scenarios or "c1" in scenarios:
        scenario_c(campaign, "c" in scenarios, "c1" in scenarios)
    if "d" in scenarios:
        scenario_d(campaign)
    if "f" in scenarios:
        scenario_f(campaign)
    campaign.save()
    print_report(campaign)
    if campaign.results["errors"]:
        sys.exit(f"failed runs: {campaign.results['errors']}")


if __name__ == "__main__":
    main()
