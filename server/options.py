"""The repository options shared by `python -m server.repository` and `python -m server.launch`
(--config, --checkpoint, --device, --gpus, --placement, --dit-instances, --set). Standard library only: the
launcher imports it without torch and hands the options to the writer's own process.
"""

from __future__ import annotations

import argparse

DEVICES = ("cpu", "cuda")
# where h3_encoder and h3_vae run on cuda: the first GPU beside an h3_dit instance, a GPU of their own, the CPU
PLACEMENTS = ("shared", "own", "cpu")
OPTIONS = ("config", "checkpoint", "device", "gpus", "placement", "dit_instances", "set")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the repository options to `parser`. Every default is None, so that a caller can tell
    which were given; server.repository.plan's defaults then apply."""
    parser.add_argument("--config", help="DiT config: tiny, small, demo, bench or h3 (default: tiny)")
    parser.add_argument(
        "--checkpoint",
        help="weights: a folder holding dit.safetensors, video_vae.safetensors and audio_vae.safetensors "
        "(optional: preview.safetensors, the previews' latent-to-RGB map; training.json, what they were trained on; "
        "step_cache.json, the step cache's fitted polynomial); "
        "an official MiniMax-H3 checkpoint folder (transformer/, text_encoder/, tokenizer/, video_vae/, "
        "audio_vae/); or random:SEED, seeded random weights drawn at load (default: checkpoints/CONFIG)",
    )
    parser.add_argument(
        "--device",
        choices=(*DEVICES, "auto"),
        help="cpu (default), cuda, or auto: cuda when torch sees a GPU, else cpu",
    )
    parser.add_argument(
        "--gpus",
        help="cuda: 'all' (default) or a comma list such as 0,1; one h3_dit instance per GPU, or per "
        "h3_dit.sp_degree consecutive GPUs with --set h3_dit.sp_degree=N",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        help="cuda: where h3_encoder and h3_vae run: shared (the first GPU, beside an h3_dit instance), own (the "
        "last GPU, with no h3_dit instance) or cpu; default: shared on one GPU, else whichever of shared and own "
        "gives the more h3_dit instances that each take a request of the config's default canvas (printed with "
        "its reason)",
    )
    parser.add_argument("--dit-instances", type=int, help="cpu: h3_dit instances (default 1)")
    parser.add_argument(
        "--set",
        action="append",
        metavar="MODEL.KEY=VALUE",
        help="set a model parameter, e.g. h3_dit.max_waiting=2 (repeatable; wins over sizing)",
    )


def given_options(args: argparse.Namespace) -> list[str]:
    """The repository options of parsed `args` that were given, as command-line arguments again."""
    argv = []
    for name in OPTIONS:
        value = getattr(args, name)
        items = (value or []) if name == "set" else ([] if value is None else [value])
        argv += [part for item in items for part in (f"--{name.replace('_', '-')}", str(item))]
    return argv
