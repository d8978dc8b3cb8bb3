"""Caption states: the real text encoder's token states of every caption the training uses.

    python -m training.text_states --out build/demo/caption_states.safetensors

The GPU machine has no MiniLM weights, so the states are computed here (CPU) with the same
TextEncoder the server uses and carried there. The file holds `states` float16 [sum L, 384]
(each caption's [L, 384] rows one after another) and `offsets` int64 [n + 1]; its metadata
`captions` is the JSON list of the captions in order: data.train_captions() (every caption
kind: full, colour-free, tone-free) then data.held_out_captions(), flagged by metadata
`num_train`.
"""

import argparse
import itertools
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file

from . import data


def compute(out: Path) -> None:
    from h3_core.model.encoder import TextEncoder

    train = data.train_captions()
    held = data.held_out_captions()
    encoder = TextEncoder()
    states = [encoder.encode(text) for text in train + held]
    offsets = torch.tensor([0] + [s.shape[0] for s in states]).cumsum(0)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {"states": torch.cat(states).half(), "offsets": offsets},
        str(out),
        metadata={"captions": json.dumps(train + held), "num_train": str(len(train))},
    )


def load(path: str | Path) -> tuple[list[str], int, list[torch.Tensor]]:
    """(captions, num_train, per-caption float32 states [L, 384]) of a caption-states file."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    bounds = tensors["offsets"].tolist()
    states = [tensors["states"][a:b].float() for a, b in itertools.pairwise(bounds)]
    return json.loads(meta["captions"]), int(meta["num_train"]), states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/demo/caption_states.safetensors"))
    args = parser.parse_args()
    compute(args.out)
    captions, num_train, states = load(args.out)
    lengths = [s.shape[0] for s in states]
    print(
        f"wrote {args.out}: {len(captions)} captions ({num_train} training), "
        f"{min(lengths)}..{max(lengths)} tokens, {args.out.stat().st_size / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
