"""Evaluate the demo model through the server on the held-out attribute combinations.

    python -m h3_core.train.evaluate [--clips 36] [--steps 8] [--concurrency 4] [--out out/eval]

Starts tritonserver (server.launch.TritonServer) on a model-repository copy that serves the
demo config with the shipped weights (repository.py), sends one prompt per held-out
combination (data.HELD_OUT: attribute combinations never trained on, seed 0, the 64 x 96 x 22
canvas) through h3_pipeline with `--concurrency` requests in flight (so they are co-batched),
and scores each returned clip (FRAMES and AUDIO) with measure.py: dominant colour, direction of
the shape's motion, dominant pitch, stereo side. --out keeps the MP4s and a JSON report.

The last line printed is one JSON object: {"attribute_accuracy", "n_clips", "per_attribute",
"seconds"}.
"""
import argparse
import json
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import data, measure
from .repository import DEMO_CONFIG, DEMO_WEIGHTS, demo_repository


def evaluate(clips: list[data.Clip], steps: int | None = None, concurrency: int = 4,
             config: str = DEMO_CONFIG, weights: Path = DEMO_WEIGHTS, out: Path | None = None,
             seed: int = 0, log=print) -> dict:
    """Serve, generate and score `clips`; returns the report (see the module docstring)."""
    from client.api import H3Client
    from server.launch import TritonServer

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="h3-eval-") as tmp:
        repo = demo_repository(Path(tmp) / "model_repository", config, weights)
        with TritonServer(repo, free_ports=True, log_file=Path(tmp) / "server.log") as server:
            client = H3Client(server.grpc_url, timeout_s=600)

            def run(clip: data.Clip):
                result, = client.generate(clip.caption, height=data.HEIGHT, width=data.WIDTH,
                                          num_frames=data.NUM_FRAMES, num_inference_steps=steps, seed=seed,
                                          return_frames=True, return_audio=True)
                return clip, result

            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(run, clips))
    scored, largest_pack = [], 0
    for clip, result in results:
        s = measure.score(clip, result.frames, result.audio)
        s["seed"], s["largest_pack"] = result.info["seed"], result.info["largest_pack"]
        largest_pack = max(largest_pack, result.info["largest_pack"])
        scored.append(s)
        marks = " ".join(f"{k}={'ok' if v else 'WRONG(' + str(s['measured'][k]) + ')'}" for k, v in s["correct"].items())
        log(f"{clip.caption!r}: {marks}")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^a-z0-9]+", "-", clip.caption)[:80].strip("-")
            (out / f"{name}.mp4").write_bytes(result.video_mp4)
    total = sum(len(s["correct"]) for s in scored)
    right = sum(sum(s["correct"].values()) for s in scored)
    report = {
        "attribute_accuracy": round(right / total, 4), "n_clips": len(scored),
        "per_attribute": {k: round(sum(s["correct"][k] for s in scored) / len(scored), 4) for k in measure.SCORED},
        "steps": results[0][1].info["num_inference_steps"], "seed": seed, "largest_pack": largest_pack, "seconds": round(time.monotonic() - start, 1),
    }
    if out is not None:
        (out / "report.json").write_text(json.dumps({**report, "clips": scored}, indent=1))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=len(data.HELD_OUT), help="how many held-out prompts (from the first)")
    parser.add_argument("--steps", type=int, help="denoise steps (default: the config's)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--config", default=DEMO_CONFIG)
    parser.add_argument("--weights", type=Path, default=DEMO_WEIGHTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="folder for the MP4s and report.json")
    args = parser.parse_args()
    report = evaluate(data.held_out_clips()[: args.clips], args.steps, args.concurrency, args.config,
                      args.weights, args.out, args.seed)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
