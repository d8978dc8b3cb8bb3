"""Generate one clip in-process (request mode) and write it as an MP4 with stereo audio.

    python -m h3_core.demo --config demo --prompt "a red ball rolls to the left" --out DIR

Weights: --checkpoint, else weights/<config> for a config the repository ships trained weights
for (demo), else checkpoints/<config> with seeded random weights (made when missing; they give
grey noise). Bad flags end with the usage, one error line on stderr and exit status 2, never a
traceback: an unknown config, a checkpoint folder that is missing or does not hold that config's
weights, a request outside the limits (a zero or negative size, steps or seed included).
"""

import argparse
import re
import time
from pathlib import Path

from .config import get_config
from .diffusion.request import GenerationRequest
from .factory import load_engine
from .media import write_mp4
from .weights.checkpoint_setup import DEFAULT_ROOT, create_checkpoint

TRAINED = {"demo": Path(__file__).resolve().parents[1] / "weights" / "demo"}  # config -> shipped weights


def checkpoint_folder(config: str, checkpoint: Path | None) -> Path:
    """The weights folder for `config`: `checkpoint` when given, else TRAINED[config], else
    checkpoints/<config>, made with seeded random weights when missing."""
    if checkpoint is not None:
        return checkpoint
    if config in TRAINED:
        return TRAINED[config]
    create_checkpoint(config, DEFAULT_ROOT / config)
    return DEFAULT_ROOT / config


def main(argv: list[str] | None = None) -> None:
    """Run the command line `argv` (sys.argv[1:] when None). Exits with status 2 for bad flags
    (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m h3_core.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="tiny", help="DiT config: tiny (default), small, demo, bench, h3")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="weights folder (default: weights/<config> if shipped, else checkpoints/<config>)",
    )
    parser.add_argument("--height", type=int, help="pixels, a multiple of 32 (default: the config's)")
    parser.add_argument("--width", type=int, help="pixels, a multiple of 32 (default: the config's)")
    parser.add_argument(
        "--num-frames", type=int, help="frames at 24 fps, served aligned up to 17n+5 (default: the config's)"
    )
    parser.add_argument("--steps", type=int, help="denoise steps (default: the config's)")
    parser.add_argument("--seed", type=int, help="random when left out")
    args = parser.parse_args(argv)

    try:
        cfg = get_config(args.config)
    except ValueError as error:
        parser.error(str(error))
    if args.checkpoint is not None and not args.checkpoint.is_dir():
        parser.error(f"--checkpoint {args.checkpoint} is not a folder")
    folder = checkpoint_folder(args.config, args.checkpoint)
    try:
        engine = load_engine(args.config, folder)
    except (FileNotFoundError, ValueError) as error:  # a file missing; tensors of another config
        parser.error(f"cannot load config {args.config!r} from {folder}: {error}")
    request = GenerationRequest(
        prompt=args.prompt,
        seed=args.seed,
        height=cfg.default_height if args.height is None else args.height,
        width=cfg.default_width if args.width is None else args.width,
        num_frames=cfg.default_num_frames if args.num_frames is None else args.num_frames,
        num_inference_steps=cfg.default_steps if args.steps is None else args.steps,
    )
    start = time.perf_counter()
    try:
        state, frames, audio = engine.generate(request)[0]
    except ValueError as error:  # the request's fields, checked in Engine.prepare before any work
        parser.error(str(error))
    name = re.sub(r"[^a-z0-9]+", "-", args.prompt.lower()).strip("-")[:48] or "clip"
    path = args.out / f"{name}-{state.seed}.mp4"
    write_mp4(path, frames, audio)
    print(
        f"wrote {path} ({frames.shape[0]} frames {frames.shape[2]}x{frames.shape[1]}, {audio.shape[1]} audio "
        f"samples, seed {state.seed}, weights {folder}) in {time.perf_counter() - start:.2f} s"
    )


if __name__ == "__main__":
    main()
