"""Data parallelism through tritonserver (issue 14): one h3_dit instance per GPU, measured on every
GPU of the host against one GPU. (Where h3_vae may decode beside a DiT instance, once its
`placement` run, is benchmarks/decode_placement.py.)

    PYTHONUNBUFFERED=1 python3 benchmarks/multi_gpu_bench.py --out DIR [--runs throughput mixed]

Each served run writes a repository with server.repository (bench config, the seed-0 bench
checkpoint drawn on the GPU, the benchmark text encoder of width 5120, return_mp4=false), starts
tritonserver (server.process.TritonServer) and runs benchmarks/bench_client.py against it:
  throughput: 16,384-row requests (672x384, 209 frames), 20 steps, 4 x GPUs requests at
     concurrency 4 x GPUs; on 1 GPU and on all N: dp{N}_over_dp1_throughput (requests/min).
  mixed: the default policy under Poisson arrivals of a mix from 128 to 16,384 rows
     (40% 96x64x22 (128 rows), 30% 672x384x22 (1,920 rows), 30% 672x384x209 (16,384 rows), 20 steps),
     24 x N requests at N x RATE on N GPUs against 24 requests at RATE on 1 GPU: mean time to first
     step and mean latency ratios; row imbalance = max / mean over the GPUs of the packed rows each
     DiT instance ran (h3_pack_rows_sum per instance on /metrics).
Writes DIR/multi_gpu_bench.json after every run and prints a table last. On a machine without
two GPUs it refuses to start.
"""

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from client_runs import bench_client_command, without_machine_paths  # noqa: E402 - after the sys.path set-up above
from served_bench import FULL_PACK_DIT, GPU, prepare_weights  # noqa: E402 - after the sys.path set-up above

from server.process import TritonServer, metric_samples, read_metrics  # noqa: E402 - after the sys.path set-up above
from server.repository import plan, write_repository  # noqa: E402 - after the sys.path set-up above

STEPS = 20
MIX = "0.4:64x96x22:20,0.3:384x672x22:20,0.3:384x672x209:20"
MIXED_REQUESTS = 24  # per GPU
MIXED_RATE = 0.25  # requests per second per GPU: about 70% busy (mean solo DiT work ~2.7 s a request)


def served(
    name: str, gpus: list[int], checkpoint: Path, encoder_path: str, bench_args: list[str], work: Path, out: Path
) -> dict:
    """One server on `gpus` + one bench_client.py run; its JSON document, with the per-instance
    packed rows read from /metrics before the server stops. Every instance is warmed up first by
    an unmeasured pass of one 2-step request per GPU sent at once (Triton places simultaneous
    newcomers on different instances; sequential warm-ups would all land on the first)."""
    repository = write_repository(
        work / name / "model_repository",
        plan(
            "bench",
            checkpoint,
            "cuda",
            gpus,
            overrides={
                "h3_dit": FULL_PACK_DIT,
                "h3_encoder": {"encoder_path": encoder_path},
            },
        ),
    )
    bench_json = work / name / "bench.json"
    with TritonServer(repository, free_ports=True, timeout=900, log_file=work / name / "server.log") as server:
        warm = bench_client_command(
            server.grpc_url, shape=(384, 672, 209), steps=2, num_prompts=len(gpus), max_concurrency=len(gpus)
        )
        if subprocess.run(warm, cwd=ROOT, stdout=subprocess.DEVNULL).returncode != 0:
            raise RuntimeError(f"the warm-up of {name} failed; server log {work / name / 'server.log'}")
        before = {
            s.labels["instance"]: s.value for s in metric_samples(read_metrics(server.metrics_url), "h3_pack_rows_sum")
        }
        command = bench_client_command(
            server.grpc_url,
            metrics_url=server.metrics_url,
            label=name,
            output_json=bench_json,
            extra=bench_args,
        )
        print(f"--- {name}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=ROOT)
        rows = {
            s.labels["instance"]: s.value - before.get(s.labels["instance"], 0.0)
            for s in metric_samples(read_metrics(server.metrics_url), "h3_pack_rows_sum")
        }
    if done.returncode != 0:
        raise RuntimeError(f"bench_client.py for {name} exited with {done.returncode}")
    document = json.loads(bench_json.read_text())
    document["packed_rows_per_instance"] = rows
    return without_machine_paths(document, work, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--work", type=Path, help="checkpoint, encoder, repositories, logs (default: a temporary folder)"
    )
    parser.add_argument("--runs", nargs="+", choices=("throughput", "mixed"), default=["throughput", "mixed"])
    args = parser.parse_args()
    gpus = list(range(torch.cuda.device_count()))
    if len(gpus) < 2:
        parser.error(f"needs at least two GPUs, found {len(gpus)}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="h3_multi_gpu."))
    checkpoint, encoder_path = prepare_weights(GPU, args.work, True)
    n = len(gpus)
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": f"{n} x {torch.cuda.get_device_name()}",
        "torch": torch.__version__,
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/multi_gpu_bench.py --out DIR --runs " + " ".join(args.runs),
        "runs": {},
        "summary": {},
    }
    runs, summary = results["runs"], results["summary"]

    def save():
        (args.out / "multi_gpu_bench.json").write_text(json.dumps(results, indent=2) + "\n")

    def run(name, on, bench_args):
        runs[name] = served(name, on, checkpoint, encoder_path, bench_args, args.work, args.out)
        save()
        return runs[name]

    if "throughput" in args.runs:
        shape = ["--height", "384", "--width", "672", "--num-frames", "209", "--steps", str(STEPS)]
        one = run("throughput_dp1", gpus[:1], ["--num-prompts", "4", "--max-concurrency", "4", *shape])
        all_ = run(f"throughput_dp{n}", gpus, ["--num-prompts", str(4 * n), "--max-concurrency", str(4 * n), *shape])
        summary[f"dp{n}_over_dp1_throughput"] = (
            all_["summary"]["throughput_req_per_min"] / one["summary"]["throughput_req_per_min"]
        )
    if "mixed" in args.runs:
        mix = ["--mix", MIX, "--max-concurrency", "0"]
        one = run(
            "mixed_dp1", gpus[:1], ["--num-prompts", str(MIXED_REQUESTS), "--request-rate", str(MIXED_RATE), *mix]
        )
        all_ = run(
            f"mixed_dp{n}",
            gpus,
            ["--num-prompts", str(MIXED_REQUESTS * n), "--request-rate", str(MIXED_RATE * n), *mix],
        )
        for key in ("time_to_first_step_s", "latency_s"):
            summary[f"mixed_dp{n}_over_dp1_mean_{key}"] = all_["summary"][key]["mean"] / one["summary"][key]["mean"]
        rows = list(all_["packed_rows_per_instance"].values())
        summary[f"mixed_dp{n}_row_imbalance"] = max(rows) / (sum(rows) / len(rows))
    save()
    print(f"\n{results['hardware']}, bench DiT bf16")
    print(f"{'run':<18}{'req':>5}{'wall s':>9}{'req/min':>9}{'mean lat s':>11}{'mean TTFS s':>12}")
    for name, document in runs.items():
        s = document["summary"]
        print(
            f"{name:<18}{s['completed']:5d}{s['wall_s']:9.1f}{s['throughput_req_per_min']:9.2f}"
            f"{s['latency_s']['mean']:11.2f}{s['time_to_first_step_s']['mean']:12.3f}"
        )
    for key, value in summary.items():
        print(f"{key:<44}{value:.4f}")


if __name__ == "__main__":
    main()
