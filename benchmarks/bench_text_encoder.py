"""A weight-free text encoder folder for benchmark hosts: a seeded random one-layer BERT.

    python benchmarks/bench_text_encoder.py DIR [--width 5120] [--seed 0]

The `bench` and `h3` DiTs read text states of width 5120 (docs/model.md §4.1), which the bundled
MiniLM (width 384) does not give, and a GPU host without internet has no pretrained encoder of
that width. This writes a Hugging Face folder that h3_core.model.encoder.TextEncoder (and so the
h3_encoder model's `encoder_path` parameter) loads like any other: a BERT with one layer of
width `--width` (heads of 64 dims, MLP width = width), random weights from torch's seeded
initialisation, saved as model.safetensors, and a character-level WordPiece vocabulary
(lower-case letters, digits, ASCII punctuation, each also as a `##` continuation), so every
prompt of those characters tokenizes to one token per character plus [CLS] and [SEP].

The states carry no meaning; they have the right shape and cost (a 5120-wide layer over a
few dozen tokens: about 0.1 s on one CPU thread, under 1% of a 16,384-row request), which is
all a serving benchmark needs.
"""

import argparse
import string
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARACTERS = string.ascii_lowercase + string.digits + string.punctuation
HEAD_DIM = 64
MAX_POSITIONS = 512


def write_bench_text_encoder(folder: str | Path, width: int = 5120, seed: int = 0) -> Path:
    """Write the encoder folder (config.json, model.safetensors, tokenizer files) and return it.

    Raises ValueError if width is not a positive multiple of 64.
    """
    if width <= 0 or width % HEAD_DIM:
        raise ValueError(f"width must be a positive multiple of {HEAD_DIM}, got {width}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL_TOKENS + list(CHARACTERS) + [f"##{c}" for c in CHARACTERS]
    tokenizer = BertTokenizerFast(
        vocab={token: index for index, token in enumerate(vocab)}, do_lower_case=True, model_max_length=MAX_POSITIONS
    )
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=width,
        num_hidden_layers=1,
        num_attention_heads=width // HEAD_DIM,
        intermediate_size=width,
        max_position_embeddings=MAX_POSITIONS,
    )
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--width", type=int, default=5120, help="hidden size = the DiT's text_dim")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = write_bench_text_encoder(args.folder, args.width, args.seed)
    print(f"benchmark text encoder (width {args.width}, seed {args.seed}) in {folder}")


if __name__ == "__main__":
    main()
