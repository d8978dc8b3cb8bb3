"""Generate one clip in-process (request mode) and write it as an MP4 with stereo audio.

    python -m h3_core.demo --config tiny --prompt "a red ball rolls left" --out DIR
"""
import argparse
import re
import time
from pathlib import Path

from .checkpoint_setup import DEFAULT_ROOT, create_checkpoint
from .engine import load_engine
from .media import write_mp4
from .request import GenerationRequest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint folder (default: checkpoints/<config>)")
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--num-frames", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()

    folder = args.checkpoint or DEFAULT_ROOT / args.config
    if args.checkpoint is None:
        create_checkpoint(args.config, folder)
    engine = load_engine(args.config, folder)
    cfg = engine.dit.cfg
    request = GenerationRequest(
        prompt=args.prompt, height=args.height or cfg.default_height, width=args.width or cfg.default_width,
        num_frames=args.num_frames or cfg.default_num_frames,
        num_inference_steps=args.steps or cfg.default_steps, seed=args.seed,
    )
    start = time.perf_counter()
    state, frames, audio = engine.generate(request)[0]
    name = re.sub(r"[^a-z0-9]+", "-", args.prompt.lower()).strip("-")[:48] or "clip"
    path = args.out / f"{name}-{state.seed}.mp4"
    write_mp4(path, frames, audio)
    print(f"wrote {path} ({frames.shape[0]} frames {frames.shape[2]}x{frames.shape[1]}, "
          f"{audio.shape[1]} audio samples, seed {state.seed}) in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
