"""The official MiniMax-H3 checkpoint layout, and a synthetic checkpoint in it.

    python -m h3_core.weights.official_checkpoint DIR [--config tiny] [--seed 0]

An official checkpoint is one folder (h3_spec §1.3, §4):

    transformer/   the DiT: config.json (diffusers keys) + diffusion_pytorch_model*.safetensors
    text_encoder/  Qwen3-VL (config.json model_type "qwen3_vl" + model*.safetensors + the image
                   processor's preprocessor_config.json and the video processor's
                   video_preprocessor_config.json)
    tokenizer/     its Qwen2 tokenizer (tokenizer.json + tokenizer_config.json)
    video_vae/     remote code: config.json auto_map + a Python module + weights (h3_core.weights.vae_hook)
    audio_vae/     the same for the audio VAE

The command writes such a folder with seeded random weights, nothing downloaded: the DiT of
`--config` in diffusers names, a random Qwen3-VL of the DiT's text width with QWEN3VL_LAYERS
decoder layers (H3 reads hidden_states[50]: the cut drops the last ones, as on the real
model), a byte-level tokenizer, and our VAEs behind the remote-code hook. Serve it with
`python -m server.launch --config tiny --checkpoint DIR --set h3_vae.trust_remote_code=true`.
"""

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor  # not the torchvision stub
from transformers.utils.logging import disable_progress_bar

from ..config import get_config
from ..model import H3DiT
from ..model.initialization import init_weights
from ..model.vae import create_vaes
from .checkpoint import TRANSFORMER_FOLDER, VAE_SEED_OFFSET, save_official_transformer
from .vae_hook import write_official_vaes

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"
SHARD_BYTES = 10 * 2**30  # diffusers' default largest shard (10 GB)
MAX_SYNTHETIC_PARAMETERS = 10**9  # bench (6.0 B) and h3 (33.1 B) would need tens of GB of CPU memory
QWEN3VL_LAYERS = 52  # decoder layers of the synthetic Qwen3-VL: two more than H3 reads
# The synthetic image processor's pixel bounds: small, so that CPU tests stay fast (a 64x96 keyframe
# is resized to 128x160: an 8x10 patch grid, 20 image tokens). Qwen3-VL's own are far larger.
SYNTHETIC_MIN_PIXELS, SYNTHETIC_MAX_PIXELS = 128 * 128, 256 * 256
# The synthetic video processor's bounds on frames x height x width: a two-frame clip is sized as an
# image is (a 4-frame 64x64 clip: 96x96 frames, 2 temporal groups of 9 video tokens).
SYNTHETIC_VIDEO_MIN_PIXELS, SYNTHETIC_VIDEO_MAX_PIXELS = 2 * SYNTHETIC_MIN_PIXELS, 8 * SYNTHETIC_MAX_PIXELS
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def is_official(folder: str | Path) -> bool:
    """True when `folder` holds an official-layout checkpoint (it has transformer/)."""
    return (Path(folder) / TRANSFORMER_FOLDER).is_dir()


def write_byte_tokenizer(folder: str | Path) -> Path:
    """Write a Qwen2-class byte-level BPE tokenizer without merges (one token per UTF-8 byte, ids
    0..255 in the order of the byte-level alphabet, then QWEN_SPECIAL_TOKENS) to `folder`
    (tokenizer.json, tokenizer_config.json naming Qwen2Tokenizer) and return the folder."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(QWEN_SPECIAL_TOKENS))
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    wrapped.save_pretrained(str(folder))
    config = Path(folder) / "tokenizer_config.json"
    text = config.read_text().replace('"TokenizersBackend"', '"Qwen2Tokenizer"')
    config.write_text(text)
    return Path(folder)


def write_random_qwen3vl(
    folder: str | Path, width: int, num_layers: int = QWEN3VL_LAYERS, seed: int = 0, dtype: str = "bfloat16"
) -> Path:
    """Write a seeded random Qwen3-VL (transformers' Qwen3VLForConditionalGeneration: a text
    decoder of `num_layers` layers and hidden size `width`, 4 query heads and 2 key/value heads of
    32 dims, MLP 128, interleaved M-RoPE sections (6, 5, 5) at theta 5e6 like Qwen3-VL; a
    one-block vision tower of Qwen3-VL's patch sizes (16 pixels, 2 frames, 2x2 merge) with one
    DeepStack merger) to `folder` (config.json, model.safetensors in `dtype`), values from
    h3_core.model.initialization.init_weights(model, seed), and its image processor's
    preprocessor_config.json (transformers' Qwen2VLImageProcessorPil: Qwen3-VL's mean and std
    0.5, pixels between SYNTHETIC_MIN_PIXELS and SYNTHETIC_MAX_PIXELS) and video processor's
    video_preprocessor_config.json (transformers' Qwen3VLVideoProcessor with its defaults, 2
    sampled frames a second, but mean and std 0.5 and frames x pixels between
    SYNTHETIC_VIDEO_MIN_PIXELS and SYNTHETIC_VIDEO_MAX_PIXELS). Its vocabulary is
    write_byte_tokenizer's. Raises ValueError if width is not a positive multiple of 32."""
    if width <= 0 or width % 32:
        raise ValueError(f"width must be a positive multiple of 32, got {width}")
    vocab = 256 + len(QWEN_SPECIAL_TOKENS)
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": vocab,
            "hidden_size": width,
            "intermediate_size": 128,
            "num_hidden_layers": num_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
            "dtype": dtype,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": width,
            "deepstack_visual_indexes": [0],
            "num_position_embeddings": 16,
        },
        image_token_id=256 + QWEN_SPECIAL_TOKENS.index("<|image_pad|>"),
        video_token_id=256 + QWEN_SPECIAL_TOKENS.index("<|video_pad|>"),
        vision_start_token_id=256 + QWEN_SPECIAL_TOKENS.index("<|vision_start|>"),
        vision_end_token_id=256 + QWEN_SPECIAL_TOKENS.index("<|vision_end|>"),
        dtype=dtype,
    )
    model = Qwen3VLForConditionalGeneration(config)
    init_weights(model, seed)
    disable_progress_bar()  # one small file: transformers' "Writing model shards" bar says nothing
    model.to(getattr(torch, dtype)).save_pretrained(str(folder))
    vision = config.vision_config
    patches = dict(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": SYNTHETIC_MIN_PIXELS, "longest_edge": SYNTHETIC_MAX_PIXELS}, **patches
    ).save_pretrained(str(folder))
    Qwen3VLVideoProcessor(
        size={"shortest_edge": SYNTHETIC_VIDEO_MIN_PIXELS, "longest_edge": SYNTHETIC_VIDEO_MAX_PIXELS}, **patches
    ).save_pretrained(str(folder))
    return Path(folder)


def write_synthetic_checkpoint(folder: str | Path, config_name: str = "tiny", seed: int = 0) -> Path:
    """Write an official-layout checkpoint (module docstring) with seeded random weights to
    `folder` and return it: the DiT of `config_name` drawn on the CPU (init_weights(dit, seed),
    save_official_transformer, shards of SHARD_BYTES), a random Qwen3-VL of the DiT's text width
    with QWEN3VL_LAYERS layers in bf16 (write_random_qwen3vl, seed), write_byte_tokenizer, and
    create_vaes(seed + 1) behind the remote-code hook (vae_hook.write_official_vaes) -- the
    same DiT and VAE values as `python -m h3_core.weights.checkpoint_setup` writes for seed 0.

    Raises ValueError for an unknown config or one of more than MAX_SYNTHETIC_PARAMETERS parameters;
    FileExistsError when `folder` exists and is not empty."""
    cfg = get_config(config_name)
    parameters = sum(p.numel() for p in H3DiT(cfg, device="meta").parameters())
    if parameters > MAX_SYNTHETIC_PARAMETERS:
        raise ValueError(
            f"config {config_name} has {parameters:,} parameters: a synthetic checkpoint is drawn in the CPU's "
            f"memory, for configs of at most {MAX_SYNTHETIC_PARAMETERS:,} (tiny, small, demo); serve "
            f"{config_name} without a file with --checkpoint random:0"
        )
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} exists and is not empty; choose a new folder")
    dit = H3DiT(cfg)
    init_weights(dit, seed)
    save_official_transformer(dit, folder, SHARD_BYTES)
    write_random_qwen3vl(folder / TEXT_ENCODER, cfg.text_dim, QWEN3VL_LAYERS, seed)
    write_byte_tokenizer(folder / TOKENIZER)
    write_official_vaes(folder, *create_vaes(seed + VAE_SEED_OFFSET))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m h3_core.weights.official_checkpoint",
        description="Write a synthetic official-layout checkpoint.",
    )
    parser.add_argument("folder", type=Path, help="new (or empty) folder to write")
    parser.add_argument("--config", default="tiny", help="DiT config (h3_core.config): its sizes and text width")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random weight")
    args = parser.parse_args()
    try:
        folder = write_synthetic_checkpoint(args.folder, args.config, args.seed)
    except (ValueError, FileExistsError) as error:
        parser.exit(2, f"python -m h3_core.weights.official_checkpoint: {error}\n")
    print(f"synthetic official checkpoint ({args.config}, seed {args.seed}) written to {folder}")
    print(
        f"serve it: python -m server.launch --config {args.config} --checkpoint {folder} "
        "--set h3_vae.trust_remote_code=true"
    )


if __name__ == "__main__":
    main()
