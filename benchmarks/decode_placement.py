"""Where h3_vae may decode beside a DiT instance (issue 33; docs/deploy_h200.md): a DiT step on
cuda:0, alone and while another process (as h3_vae is) decodes 672x384x209 clips without pause,
for each placement that keeps the ensemble as it is.

    PYTHONUNBUFFERED=1 python3 benchmarks/decode_placement.py --out DIR [--configs h3 bench]
        [--steps 8] [--shares 0.05 0.2]

The DiT: each config's DiT (seeded random weights drawn on the GPU, `random:0`), compiled and
warmed up as h3_dit does, stepping one 16,384-row request (672x384, 209 frames, docs/model.md §4.4).
The decoder: our VAEs (random:0) in a process of its own, decoding one clip's latents after the
other (h3_core.model.vae.decode_clip, in its tiles), with 5 CPU threads (h3_vae's sized
cpu_threads on 16 cores). Placements:
  alone:      no decodes;
  same_gpu:   decodes on cuda:0, computing beside the steps (the GPU time-slices the two processes);
  turns_S:    decodes on cuda:0 taking turns with the steps (h3_core.serving.shared.gpu_turns, turn_share S:
              the writer's default beside an h3_dit instance, with S = DEFAULT_SHARE);
  cpu:        decodes on the CPU;
  other_gpu:  decodes on cuda:1 (only where the host has a second GPU).
For each: the mean wall seconds of `--steps` DiT steps after one unmeasured step, each from the
moment it asks for the GPU (with turns: for its turn) until the device has done it, and its ratio
over alone; the decodes the decoder finished meanwhile and their mean seconds. Also each
decode's seconds with nothing beside it, on cuda:0 (median of 3) and on the CPU (one clip).

Writes DIR/decode_placement.json (date, hardware, command, settings, results) and prints a table
last. On a machine without CUDA it refuses to start. Expected on one H200 with --configs h3: about
4 minutes (the h3 DiT's load and compilation about 1, 5 placements of 9 steps of 1.8-3.7 s).
"""

import argparse
import contextlib
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from h3_core.config import audio_latent_frames, latent_frames  # noqa: E402 - after the sys.path set-up above
from h3_core.diffusion.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above
from h3_core.model.vae import decode_clip  # noqa: E402 - after the sys.path set-up above
from h3_core.serving.shared.gpu_turns import DEFAULT_SHARE, GpuTurns, decode_tiles  # noqa: E402 - after the sys.path set-up above
from h3_core.weights.vae_hook import load_vaes  # noqa: E402 - after the sys.path set-up above

WEIGHTS = "random:0"
HEIGHT, WIDTH, NUM_FRAMES = 384, 672, 209  # 16,384 rows with a 64-token prompt (docs/model.md §4.4)
TEXT_LEN = 64
DECODE_THREADS = 5  # h3_vae's sized cpu_threads on a 16-core host (server.sizing.cpu_threads)


def clip_latents(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded latents of one 672x384x209 clip on `device`: video [24, 53, 24, 42], audio [2, 32, 348]."""
    generator = torch.Generator().manual_seed(0)
    video = torch.randn(24, latent_frames(NUM_FRAMES), HEIGHT // 16, WIDTH // 16, generator=generator)
    audio = torch.randn(2, 32, audio_latent_frames(NUM_FRAMES), generator=generator)
    return video.to(device), audio.to(device)


def decode_seconds(device: str, clips: int) -> list[float]:
    """Seconds of each of `clips` decodes on `device` with nothing beside them (on a GPU after one
    unmeasured)."""
    torch.set_num_threads(DECODE_THREADS)
    video_vae, audio_vae = load_vaes(WEIGHTS, device)
    video, audio = clip_latents(device)
    seconds = []
    warm_up = device != "cpu"
    for _ in range(clips + warm_up):
        start = time.perf_counter()
        decode_clip(video_vae, audio_vae, NUM_FRAMES, video, audio)
        if device != "cpu":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds[warm_up:]


def decode_forever(device: str, turns_folder: str | None, share: float) -> None:
    """The decoder process: decode one clip after the other on `device`, in turns with the DiT
    steps when `turns_folder` is given; prints "ready" once loaded, then each decode's seconds."""
    torch.set_num_threads(DECODE_THREADS)
    video_vae, audio_vae = load_vaes(WEIGHTS, device)
    video, audio = clip_latents(device)
    turns = GpuTurns.on_device(turns_folder, device, share) if turns_folder else None
    decode_clip(video_vae, audio_vae, NUM_FRAMES, video, audio)  # unmeasured: first-use set-up
    print("ready", flush=True)
    while True:
        start = time.perf_counter()
        with decode_tiles(turns) as tile:
            decode_clip(video_vae, audio_vae, NUM_FRAMES, video, audio, tile)
        if device != "cpu":
            torch.cuda.synchronize(device)
        print(f"{time.perf_counter() - start:.6f}", flush=True)


def steps_beside(engine, work: Path, steps: int, device: str | None, share: float | None) -> dict:
    """`steps` DiT steps of a 16,384-row request on cuda:0 (after one unmeasured) while a decoder
    process decodes on `device` (None: none), in turns of `share` when given. Returns step_s (mean),
    step_s_each, decodes (finished meanwhile) and decode_s_mean."""
    text = torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    (state,) = engine.prepare(GenerationRequest("placement", HEIGHT, WIDTH, NUM_FRAMES, steps + 1, seed=0), text)
    folder = work / "turns" if share is not None else None
    turns = GpuTurns.on_device(folder, "cuda:0") if folder is not None else None
    decoder = None
    if device is not None:
        command = [sys.executable, __file__, "--out", str(work), "--decode-forever", device]
        if folder is not None:
            command += ["--turns-folder", str(folder), "--share", str(share)]
        decoder = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert decoder.stdout.readline().strip() == "ready"
    each = []

    @contextlib.contextmanager
    def timed_step(step: int, states: list):
        start = time.perf_counter()
        with turns.step() if turns is not None else contextlib.nullcontext():
            yield
            torch.cuda.synchronize()
        each.append(time.perf_counter() - start)

    try:
        engine.run_to_completion([state], step_context=timed_step)
    finally:
        if decoder is not None:
            decoder.kill()
            decoder.wait()
        if turns is not None:
            turns.close()
    decodes = [float(line) for line in decoder.stdout.read().split()] if decoder is not None else []
    return {
        "step_s": statistics.mean(each[1:]),
        "step_s_each": each[1:],
        "decodes": len(decodes),
        "decode_s_mean": statistics.mean(decodes) if decodes else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for decode_placement.json")
    parser.add_argument("--configs", nargs="+", default=["h3"], help="DiT configs (h3_core.config)")
    parser.add_argument("--steps", type=int, default=8, help="measured DiT steps per placement")
    parser.add_argument("--shares", nargs="+", type=float, default=[DEFAULT_SHARE], help="turn_share values to measure")
    parser.add_argument("--decode-forever", metavar="DEVICE", help=argparse.SUPPRESS)  # the decoder process
    parser.add_argument("--turns-folder", help=argparse.SUPPRESS)
    parser.add_argument("--share", type=float, default=DEFAULT_SHARE, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_forever:
        return decode_forever(args.decode_forever, args.turns_folder, args.share)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="h3_decode_placement."))
    placements = [("alone", None, None), ("same_gpu", "cuda:0", None)]
    placements += [(f"turns_{share:g}", "cuda:0", share) for share in args.shares]
    placements += [("cpu", "cpu", None)]
    if torch.cuda.device_count() > 1:
        placements.append(("other_gpu", "cuda:1", None))
    results = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": "PYTHONUNBUFFERED=1 python3 benchmarks/decode_placement.py --out DIR --configs "
        + " ".join(args.configs)
        + f" --steps {args.steps} --shares "
        + " ".join(f"{share:g}" for share in args.shares),
        "settings": {"height": HEIGHT, "width": WIDTH, "num_frames": NUM_FRAMES, "weights": WEIGHTS},
        "decode_alone_s": {},
        "configs": {},
    }

    def save():
        (args.out / "decode_placement.json").write_text(json.dumps(results, indent=2) + "\n")

    results["decode_alone_s"]["cuda:0"] = statistics.median(decode_seconds("cuda:0", 3))
    results["decode_alone_s"]["cpu"] = decode_seconds("cpu", 1)[0]
    torch.cuda.empty_cache()
    save()
    limits = RequestLimits(
        max_height=HEIGHT, max_width=WIDTH, max_num_frames=NUM_FRAMES, max_rows=1 << 20, max_request_mb=1 << 20
    )
    for config in args.configs:
        engine = load_engine(config, WEIGHTS, "cuda:0", with_encoder=False, with_vaes=False, limits=limits)
        engine.warm_up()
        runs = results["configs"][config] = {}
        for name, device, share in placements:
            print(f"--- {config}: {name}", flush=True)
            runs[name] = steps_beside(engine, work, args.steps, device, share)
            runs[name]["over_alone"] = runs[name]["step_s"] / runs["alone"]["step_s"]
            save()
        del engine
        torch.cuda.empty_cache()
    print(f"\n{results['hardware']}: a 16,384-row DiT step beside decodes of 672x384x209 clips")
    alone = results["decode_alone_s"]
    print(f"decode alone: cuda:0 {alone['cuda:0']:.3f} s, cpu {alone['cpu']:.2f} s")
    print(f"{'config':<7}{'placement':<13}{'step s':>9}{'over alone':>12}{'decodes':>9}{'decode s':>10}")
    for config, runs in results["configs"].items():
        for name, run in runs.items():
            decode = f"{run['decode_s_mean']:.3f}" if run["decode_s_mean"] is not None else "-"
            print(f"{config:<7}{name:<13}{run['step_s']:9.3f}{run['over_alone']:12.3f}{run['decodes']:9d}{decode:>10}")


if __name__ == "__main__":
    main()
