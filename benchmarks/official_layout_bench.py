"""An official-layout MiniMax-H3 checkpoint on one GPU host: written, read from disk, served as a
user serves it, one request end to end (issue: deploy the official model on H200 hosts).

    PYTHONUNBUFFERED=1 python3 benchmarks/official_layout_bench.py --work DIR [--steps 4] [--no-mp4]

In order, each step timed:
  write:   `python -m h3_core.weights.official_checkpoint DIR/checkpoint --config bench --text-encoder h3
           --text-encoder-layers 8 --device cuda` (the `bench` DiT: H3's first 8 layers, 6.0 B
           parameters, 12.1 GB; a Qwen3-VL at MiniMax-H3's real sizes with 8 decoder layers, 6.05 B
           parameters, 12.1 GB; the byte-level tokenizer; our VAEs behind the remote-code hook; all
           drawn on the GPU, about 24 GB on the host's disk): seconds and bytes written;
  cache:   `sync; echo 3 > /proc/sys/vm/drop_caches`, so that the next step reads the disk, not the
           page cache; in a container it may be refused: the JSON says whether it worked (the
           CPU smoke does not try);
  load:    in a process of its own, every safetensors file of transformer/ and of text_encoder/ read
           to the GPU (safetensors' load_file onto cuda:0, then a synchronize): bytes,
           seconds and bytes per second per folder; then the load time of the full model's
           weights at those rates, EXTRAPOLATED (not measured): the `h3` DiT's 66.3 GB
           (server.sizing.dit_weight_bytes) at transformer/'s rate, MiniMax-H3's Qwen3-VL text
           decoder cut to 50 layers, 50.3 GB (QWEN3VL_H3.parameters() in bf16; its vision tower
           not counted) at text_encoder/'s;
  serve:   `python -m server.launch --device cuda --gpus all --config bench --checkpoint DIR/checkpoint
           --set h3_vae.trust_remote_code=true --set h3_encoder.hidden_layer=8 --free-ports --timeout 900
           --then ...` (the writer sizes the rest from the GPU's memory); launch-to-ready seconds (the
           launcher's start to its --then command's start: the repository writer, tritonserver, every
           model's load), then one t2va request of 672x384, 209 frames and --steps steps (default 4)
           through benchmarks/bench_client.py, its latency, stage seconds (INFO stage_seconds: queue,
           encode, denoise, decode) and result, return_mp4=true where PyAV is importable (else false,
           as served_bench.py and full_model_bench.py decide).
Writes DIR/official_layout_bench.json (date, hardware, command, settings, results) after every step
and prints a short table last. Expected on one H200: under about 5 minutes (write ~1.5-2 min, load
~0.5 min, ready ~1 min, the request ~0.5 min). Without CUDA the same steps run as a CPU smoke test
(about a minute): the `tiny` DiT, a tiny 8-layer Qwen3-VL (write_random_qwen3vl's sizes), 96x64,
22 frames, 2 steps; tests/test_benchmarks_smoke.py runs it.
"""

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from client_runs import bench_client_command  # noqa: E402 - after the sys.path set-up above

from h3_core.config import get_config  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.official_checkpoint import (  # noqa: E402 - after the sys.path set-up above
    QWEN3VL_H3,
    TEXT_ENCODER,
    TRANSFORMER_FOLDER,
)
from server.sizing import dit_weight_bytes  # noqa: E402 - after the sys.path set-up above

GB = 10**9
DROP_CACHES = "sync; echo 3 > /proc/sys/vm/drop_caches"
LOADED_FOLDERS = (TRANSFORMER_FOLDER, TEXT_ENCODER)
SERVER_TIMEOUT_S = 900
FULL_CONFIG = "h3"  # the extrapolation's DiT


@dataclass(frozen=True)
class Setting:
    """One run's sizes (the GPU run or the CPU smoke)."""

    config: str
    text_encoder: str  # write_synthetic_checkpoint's TEXT_ENCODERS
    text_encoder_layers: int
    device: str
    height: int
    width: int
    num_frames: int
    steps: int


GPU = Setting("bench", "h3", 8, "cuda", 384, 672, 209, steps=4)
CPU = Setting("tiny", "tiny", 8, "cpu", 64, 96, 22, steps=2)
SETTINGS = {"gpu": GPU, "cpu": CPU}


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def drop_page_cache(cuda: bool) -> dict:
    """Run DROP_CACHES on a GPU host (not on the CPU smoke's machine: its other work keeps its
    cache); {"command", "dropped": whether it ran and exited 0, "message": its stderr, or why not}."""
    if not cuda:
        return {"command": DROP_CACHES, "dropped": False, "message": "not tried: the CPU smoke leaves the cache"}
    done = subprocess.run(["sh", "-c", DROP_CACHES], capture_output=True, text=True)
    return {"command": DROP_CACHES, "dropped": done.returncode == 0, "message": done.stderr.strip()}


def load_probe(checkpoint: Path, device: str) -> dict:
    """Read every safetensors file of LOADED_FOLDERS of `checkpoint` onto `device` (one file at a
    time, kept until its folder is read, then freed), timed per folder: {folder: {files, bytes,
    seconds, bytes_per_s}}."""
    from safetensors.torch import load_file

    def synchronize() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    result = {}
    for name in LOADED_FOLDERS:
        files = sorted((checkpoint / name).glob("*.safetensors"))
        synchronize()
        start = time.perf_counter()
        tensors = [load_file(str(file), device=device) for file in files]
        synchronize()
        seconds = time.perf_counter() - start
        size = sum(file.stat().st_size for file in files)
        result[name] = {"files": len(files), "bytes": size, "seconds": seconds, "bytes_per_s": size / seconds}
        del tensors
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return result


def extrapolated_load(load: dict) -> dict:
    """The full model's weight load at the measured rates (module docstring): EXTRAPOLATED."""
    dit = dit_weight_bytes(get_config(FULL_CONFIG), "none")
    qwen3vl = 2 * QWEN3VL_H3.parameters()
    dit_s = dit / load[TRANSFORMER_FOLDER]["bytes_per_s"]
    qwen3vl_s = qwen3vl / load[TEXT_ENCODER]["bytes_per_s"]
    return {
        "extrapolated": True,
        "how": "bytes / the measured bytes_per_s of the same folder of the synthetic checkpoint",
        "dit_bytes": dit,
        "dit_seconds": dit_s,
        "qwen3vl_text_decoder_50_layers_bytes": qwen3vl,
        "qwen3vl_seconds": qwen3vl_s,
        "total_seconds": dit_s + qwen3vl_s,
    }


def client_phase(args) -> int:
    """The launcher's --then command: the time it started (the server is ready), then one
    bench_client.py request to the server of H3_GRPC_URL / H3_METRICS_URL."""
    (args.work / "ready_unix_s").write_text(repr(time.time()))
    setting = SETTINGS[args.client]  # not torch.cuda.is_available(): no CUDA context in this process
    mp4 = importlib.util.find_spec("av") is not None and not args.no_mp4
    command = bench_client_command(
        None,  # bench_client.py reads H3_GRPC_URL
        shape=(setting.height, setting.width, setting.num_frames),
        steps=args.steps or setting.steps,
        num_prompts=1,
        max_concurrency=1,
        mp4=mp4,
        label="t2va",
        output_json=args.work / "bench_t2va.json",
    )
    if os.environ.get("H3_METRICS_URL"):
        command += ["--metrics-url", os.environ["H3_METRICS_URL"]]
    return subprocess.run(command, cwd=ROOT).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="checkpoint, server log, official_layout_bench.json")
    parser.add_argument("--steps", type=int, help="denoise steps of the request (default 4; 2 on the CPU)")
    parser.add_argument("--no-mp4", action="store_true", help="return_mp4=false even where PyAV is importable")
    parser.add_argument("--load-probe", metavar="DEVICE", help=argparse.SUPPRESS)  # the load step's process
    parser.add_argument("--client", choices=sorted(SETTINGS), help=argparse.SUPPRESS)  # the launcher's --then command
    args = parser.parse_args()
    checkpoint = args.work / "checkpoint"
    if args.load_probe:
        result = load_probe(checkpoint, args.load_probe)
        (args.work / "load_probe.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0
    if args.client:
        return client_phase(args)
    cuda = torch.cuda.is_available()
    setting = GPU if cuda else CPU
    steps = args.steps or setting.steps
    mp4 = importlib.util.find_spec("av") is not None and not args.no_mp4
    args.work.mkdir(parents=True, exist_ok=True)
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(0) if cuda else "CPU",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/official_layout_bench.py --work DIR"
        + ("" if args.steps is None else f" --steps {args.steps}")
        + (" --no-mp4" if args.no_mp4 else ""),
        "settings": {**asdict(setting), "steps": steps, "return_mp4": mp4},
        "results": {},
        "errors": {},
    }
    out = results["results"]

    def save() -> None:
        text = json.dumps(results, indent=2).replace(str(args.work), "$WORK") + "\n"
        (args.work / "official_layout_bench.json").write_text(text)

    def run(name: str, command: list[str], timeout: float | None = None) -> tuple[bool, float]:
        """Run `command` in the checkout, timed; a failure is recorded under errors[name]."""
        print(f"--- {name}: {' '.join(command[1:] if command[0] == sys.executable else command)}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, timeout=timeout)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            results["errors"][name] = f"exited with {done.returncode}"
        return done.returncode == 0, seconds

    write = [
        *(sys.executable, "-m", "h3_core.weights.official_checkpoint", str(checkpoint), "--config", setting.config),
        *("--text-encoder", setting.text_encoder, "--text-encoder-layers", str(setting.text_encoder_layers)),
        *("--device", setting.device),
    ]
    results["settings"]["write_command"] = " ".join(["python3", *write[1:]]).replace(str(args.work), "$WORK")
    ok, seconds = run("write", write)
    if not ok:
        save()
        return 1
    written = folder_bytes(checkpoint)
    out["write"] = {"seconds": seconds, "bytes": written, "bytes_per_s": written / seconds}
    out["write"]["folders_bytes"] = {path.name: folder_bytes(path) for path in sorted(checkpoint.iterdir())}
    save()

    out["page_cache"] = drop_page_cache(cuda)
    print(f"--- page cache dropped: {out['page_cache']['dropped']} {out['page_cache']['message']}", flush=True)
    device = "cuda:0" if cuda else "cpu"
    ok, seconds = run("load", [sys.executable, __file__, "--work", str(args.work), "--load-probe", device])
    if ok:
        out["load"] = {
            "device": device,
            "page_cache_dropped": out["page_cache"]["dropped"],
            "process_s": seconds,
            **json.loads((args.work / "load_probe.json").read_text()),
        }
        out["full_model_load"] = extrapolated_load(out["load"])
    save()

    launch = [
        *(sys.executable, "-m", "server.launch", "--config", setting.config, "--checkpoint", str(checkpoint)),
        *("--set", "h3_vae.trust_remote_code=true"),
        *("--set", f"h3_encoder.hidden_layer={setting.text_encoder_layers}"),
        *(["--device", "cuda", "--gpus", "all"] if cuda else []),
        *("--free-ports", "--timeout", str(SERVER_TIMEOUT_S), "--quiet", "--log-file", str(args.work / "server.log")),
    ]
    results["settings"]["launch_command"] = " ".join(["python3", *launch[1:]]).replace(str(args.work), "$WORK")
    client = [sys.executable, __file__, "--work", str(args.work), "--client", "gpu" if cuda else "cpu"]
    client += [] if mp4 else ["--no-mp4"]
    client += ["--steps", str(steps)]
    for stale in ("ready_unix_s", "bench_t2va.json"):
        (args.work / stale).unlink(missing_ok=True)
    start = time.time()
    ok, seconds = run("serve", [*launch, "--then", *client])
    ready = args.work / "ready_unix_s"
    serve = out["serve"] = {
        "launch_to_ready_s": float(ready.read_text()) - start if ready.is_file() else None,
        "launch_to_stop_s": seconds,
    }
    document = args.work / "bench_t2va.json"
    if document.is_file():
        bench = json.loads(document.read_text())
        request = bench["requests"][0]
        serve.update(
            success=request["success"],
            error=request.get("error"),
            latency_s=bench["summary"]["latency_s"]["mean"],
            stage_seconds=request["stage_seconds"],
            server_info=request["server_info"],
            bench_client=bench["summary"],
        )
        if not request["success"]:
            results["errors"]["serve"] = f"{request['error_code']}: {request['error']}"
    save()
    print_table(results)
    return 1 if results["errors"] else 0


def print_table(results: dict) -> None:
    out, s = results["results"], results["settings"]

    def f(value, spec: str = ".1f") -> str:
        return "null" if value is None else format(value, spec)

    print(
        f"\n{results['hardware']}: official-layout checkpoint, {s['config']} DiT, Qwen3-VL {s['text_encoder']} sizes "
        f"x {s['text_encoder_layers']} layers, {s['width']}x{s['height']}, {s['num_frames']} frames, {s['steps']} steps"
    )
    if "write" in out:
        w = out["write"]
        print(f"write     {f(w['seconds'])} s, {w['bytes'] / GB:.2f} GB ({w['bytes_per_s'] / GB:.2f} GB/s)")
    cache = out.get("page_cache", {})
    print(f"cache     dropped: {cache.get('dropped')} {cache.get('message', '')}".rstrip())
    for name in LOADED_FOLDERS:
        if name in out.get("load", {}):
            r = out["load"][name]
            rate = r["bytes_per_s"] / GB
            print(f"load      {name}: {r['bytes'] / GB:.2f} GB in {f(r['seconds'], '.2f')} s = {rate:.2f} GB/s")
    if "full_model_load" in out:
        x = out["full_model_load"]
        print(
            f"EXTRAPOLATED full model load: DiT {x['dit_bytes'] / GB:.1f} GB {f(x['dit_seconds'])} s + Qwen3-VL cut "
            f"{x['qwen3vl_text_decoder_50_layers_bytes'] / GB:.1f} GB {f(x['qwen3vl_seconds'])} s = "
            f"{f(x['total_seconds'])} s"
        )
    serve = out.get("serve", {})
    print(f"serve     launch to ready {f(serve.get('launch_to_ready_s'))} s")
    if "latency_s" in serve:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in (serve["stage_seconds"] or {}).items())
        print(f"request   success {serve['success']}, latency {f(serve['latency_s'], '.2f')} s; stage s: {stages}")
    for name, error in results["errors"].items():
        print(f"step {name} FAILED: {error}")


if __name__ == "__main__":
    sys.exit(main())
