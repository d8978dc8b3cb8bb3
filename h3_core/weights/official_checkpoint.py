"""The official MiniMax-H3 checkpoint layout, and a synthetic checkpoint in it.

    python -m h3_core.weights.official_checkpoint DIR [--config tiny] [--seed 0]
        [--text-encoder tiny|h3] [--text-encoder-layers 52] [--device cpu]

An official checkpoint is one folder (docs/model.md §1.3, §4):

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
On a GPU host, `--config bench --text-encoder h3 --text-encoder-layers 8 --device cuda` writes
the 8-layer H3 DiT (6.0 B parameters, 12 GB) and an 8-layer Qwen3-VL at MiniMax-H3's real
sizes (6.05 B parameters, 12.1 GB) drawn on the GPU: serve it with `--set h3_encoder.hidden_layer=8`.
write_weightless_qwen3vl writes a Qwen3-VL folder without weights, for h3_encoder's
encoder_weights random:SEED.
"""

import argparse
import inspect
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLTextConfig,
)
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor  # not the torchvision stub
from transformers.utils.logging import disable_progress_bar

from ..config import get_config
from ..model import H3DiT
from ..model.dit import use_bitwise_cublas
from ..model.encoder import QWEN3VL_H3_LAYER
from ..model.initialization import init_weights
from ..model.vae import create_vaes
from .checkpoint import TRANSFORMER_FOLDER, VAE_SEED_OFFSET, save_official_transformer
from .vae_hook import write_official_vaes

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"
TEXT_ENCODERS = ("tiny", "h3")  # write_synthetic_checkpoint's text encoder sizes
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


@dataclass(frozen=True)
class Qwen3VLDims:
    """Sizes of a Qwen3-VL: its text decoder's (transformers' Qwen3VLTextConfig fields; M-RoPE
    sections interleaved), its vision tower's fields that differ from transformers'
    Qwen3VLVisionConfig defaults (`vision`; out_hidden_size is always hidden_size), and the pixel
    bounds (min, max) of its image processor and of its video processor (frames x pixels; None =
    transformers' Qwen3VLVideoProcessor defaults)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_hidden_layers: int
    rope_theta: float
    mrope_section: tuple[int, int, int]
    max_position_embeddings: int
    vision: tuple[tuple[str, object], ...] = ()
    image_pixels: tuple[int, int] = (65536, 16777216)  # Qwen3-VL's preprocessor_config.json
    video_pixels: tuple[int, int] | None = None

    def parameters(self) -> int:
        """Parameters of the text decoder with its final norm replaced by the identity (as
        h3_core.model.encoder.load_qwen3vl serves it): the token embedding, and per layer the
        q/k/v/o projections (no biases), the per-head q/k norms, the gated MLP (gate, up, down) and
        the two RMSNorms. QWEN3VL_H3's: 25,157,829,120."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attention + 2 * self.head_dim + 3 * self.hidden_size * self.intermediate_size + 2 * self.hidden_size
        return self.vocab_size * self.hidden_size + self.num_hidden_layers * layer


# docs/model.md §4.1: MiniMax-H3's text encoder (the Qwen3-VL 32B text decoder), cut to the 50 layers H3
# reads; its vision tower is transformers' default Qwen3-VL one
QWEN3VL_H3 = Qwen3VLDims(5120, 64, 8, 128, 25600, 151936, QWEN3VL_H3_LAYER, 5e6, (24, 20, 20), 262144)
# The synthetic Qwen3-VL's: 4 query heads and 2 key/value heads of 32 dims, MLP 128, the byte-level
# tokenizer's vocabulary, and a one-block vision tower of Qwen3-VL's patch sizes (16 pixels, 2 frames,
# 2x2 merge) with one DeepStack merger; its hidden size is the DiT's text width (tiny_qwen3vl).
QWEN3VL_TINY = Qwen3VLDims(
    64,
    4,
    2,
    32,
    128,
    256 + len(QWEN_SPECIAL_TOKENS),
    QWEN3VL_LAYERS,
    5e6,
    (6, 5, 5),
    4096,
    vision=(
        ("depth", 1),
        ("hidden_size", 32),
        ("intermediate_size", 64),
        ("num_heads", 2),
        ("deepstack_visual_indexes", [0]),
        ("num_position_embeddings", 16),
    ),
    image_pixels=(SYNTHETIC_MIN_PIXELS, SYNTHETIC_MAX_PIXELS),
    video_pixels=(SYNTHETIC_VIDEO_MIN_PIXELS, SYNTHETIC_VIDEO_MAX_PIXELS),
)


def tiny_qwen3vl(width: int, num_layers: int = QWEN3VL_LAYERS) -> Qwen3VLDims:
    """QWEN3VL_TINY of hidden size `width` and `num_layers` decoder layers.
    Raises ValueError if width is not a positive multiple of 32."""
    if width <= 0 or width % 32:
        raise ValueError(f"width must be a positive multiple of 32, got {width}")
    return replace(QWEN3VL_TINY, hidden_size=width, num_hidden_layers=num_layers)


def qwen3vl_config(dims: Qwen3VLDims, dtype: str = "bfloat16") -> Qwen3VLConfig:
    """transformers' Qwen3VLConfig of `dims` in `dtype`, its image, video and vision token ids
    write_byte_tokenizer's special tokens (ids 256 + i: the vocabulary may hold more ids than the
    tokenizer gives). RoPE as rope_parameters on transformers 5, rope_theta + rope_scaling on 4.x."""
    rope = {"rope_type": "default", "mrope_section": list(dims.mrope_section), "mrope_interleaved": True}
    if "rope_parameters" in inspect.signature(Qwen3VLTextConfig.__init__).parameters:
        rope_kwargs = {"rope_parameters": {**rope, "rope_theta": dims.rope_theta}}
    else:
        rope_kwargs = {"rope_theta": dims.rope_theta, "rope_scaling": rope}
    special = {token: 256 + i for i, token in enumerate(QWEN_SPECIAL_TOKENS)}
    return Qwen3VLConfig(
        text_config={
            "vocab_size": dims.vocab_size,
            "hidden_size": dims.hidden_size,
            "intermediate_size": dims.intermediate_size,
            "num_hidden_layers": dims.num_hidden_layers,
            "num_attention_heads": dims.num_attention_heads,
            "num_key_value_heads": dims.num_key_value_heads,
            "head_dim": dims.head_dim,
            "max_position_embeddings": dims.max_position_embeddings,
            "dtype": dtype,
            **rope_kwargs,
        },
        vision_config={**dict(dims.vision), "out_hidden_size": dims.hidden_size},
        image_token_id=special["<|image_pad|>"],
        video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"],
        vision_end_token_id=special["<|vision_end|>"],
        dtype=dtype,
    )


def write_qwen3vl_config(folder: str | Path, dims: Qwen3VLDims, dtype: str = "bfloat16") -> Qwen3VLConfig:
    """Write a Qwen3-VL folder's files other than weights to `folder` and return its config:
    config.json (qwen3vl_config), the image processor's preprocessor_config.json (transformers'
    Qwen2VLImageProcessorPil: Qwen3-VL's mean and std 0.5, pixels within dims.image_pixels) and
    the video processor's video_preprocessor_config.json (transformers' Qwen3VLVideoProcessor with
    its defaults, 2 sampled frames a second, but mean and std 0.5 and frames x pixels within
    dims.video_pixels when given), both of the vision tower's patch sizes."""
    config = qwen3vl_config(dims, dtype)
    config.save_pretrained(str(folder))
    vision = config.vision_config
    patches = dict(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    low, high = dims.image_pixels
    Qwen2VLImageProcessorPil(size={"shortest_edge": low, "longest_edge": high}, **patches).save_pretrained(str(folder))
    if dims.video_pixels is not None:
        low, high = dims.video_pixels
        patches["size"] = {"shortest_edge": low, "longest_edge": high}
    Qwen3VLVideoProcessor(**patches).save_pretrained(str(folder))
    return config


def write_weightless_qwen3vl(folder: str | Path, dims: Qwen3VLDims = QWEN3VL_H3) -> Path:
    """Write a Qwen3-VL folder without weights to `folder` (write_qwen3vl_config in bf16, and
    write_byte_tokenizer's files beside) and return it: what h3_encoder serves with
    encoder_path = this folder and encoder_weights = random:SEED (seeded random weights drawn on
    its device, h3_core.model.encoder.TextEncoder), e.g. MiniMax-H3's text encoder at its real
    sizes (QWEN3VL_H3) on a host without its 67 GB of weights."""
    write_qwen3vl_config(folder, dims)
    return write_byte_tokenizer(folder)


def write_random_qwen3vl(
    folder: str | Path, dims: Qwen3VLDims, seed: int = 0, device: str = "cpu", dtype: str = "bfloat16"
) -> Path:
    """Write a seeded random Qwen3-VL of `dims` (transformers' Qwen3VLForConditionalGeneration,
    built in float32 on `device`, values from h3_core.model.initialization.init_weights(model,
    seed), saved in `dtype` as model.safetensors or transformers' shards with their index) and
    write_qwen3vl_config's files to `folder`; return the folder. Its vocabulary's first ids are
    write_byte_tokenizer's."""
    config = write_qwen3vl_config(folder, dims, dtype)
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config)
    init_weights(model, seed)
    disable_progress_bar()  # transformers' "Writing model shards" bar says nothing here
    model.to(getattr(torch, dtype)).save_pretrained(str(folder))
    return Path(folder)


def write_synthetic_checkpoint(
    folder: str | Path,
    config_name: str = "tiny",
    seed: int = 0,
    text_encoder: str = "tiny",
    text_encoder_layers: int = QWEN3VL_LAYERS,
    device: str = "cpu",
) -> Path:
    """Write an official-layout checkpoint (module docstring) with seeded random weights to
    `folder` and return it: the DiT of `config_name` drawn on `device` (init_weights(dit, seed),
    save_official_transformer, shards of SHARD_BYTES), a random Qwen3-VL in bf16 with
    `text_encoder_layers` decoder layers drawn on `device` (write_random_qwen3vl, seed) of the
    sizes `text_encoder` names (TEXT_ENCODERS: "tiny" = tiny_qwen3vl of the DiT's text width;
    "h3" = MiniMax-H3's real sizes, QWEN3VL_H3, for a DiT of text width 5120: 0.98 GB a decoder
    layer, plus 3.1 GB of embedding and output head and 1.2 GB of vision tower),
    write_byte_tokenizer, and create_vaes(seed + 1) behind the remote-code hook
    (vae_hook.write_official_vaes, on the CPU) -- with the defaults the same DiT and VAE values
    as `python -m h3_core.weights.checkpoint_setup` writes for seed 0. Values drawn on CUDA differ
    from the CPU's.

    Raises ValueError for an unknown config or text_encoder, text_encoder_layers < 1, a text
    encoder of another width than the DiT's text width, or, on the CPU, a config of more than
    MAX_SYNTHETIC_PARAMETERS parameters; FileExistsError when `folder` exists and is not empty."""
    cfg = get_config(config_name)
    if text_encoder not in TEXT_ENCODERS:
        raise ValueError(f"text_encoder {text_encoder!r} is not one of {list(TEXT_ENCODERS)}")
    if text_encoder_layers < 1:
        raise ValueError(f"text_encoder_layers={text_encoder_layers} is out of range: allowed >= 1")
    if text_encoder == "tiny":
        dims = tiny_qwen3vl(cfg.text_dim, text_encoder_layers)
    else:
        dims = replace(QWEN3VL_H3, num_hidden_layers=text_encoder_layers)
    if dims.hidden_size != cfg.text_dim:
        raise ValueError(
            f"text_encoder {text_encoder} gives {dims.hidden_size}-wide states but config {config_name} reads "
            f"{cfg.text_dim}-wide ones: choose text_encoder tiny or a config of text width {dims.hidden_size} "
            "(bench, h3)"
        )
    parameters = sum(p.numel() for p in H3DiT(cfg, device="meta").parameters())
    if torch.device(device).type == "cpu" and parameters > MAX_SYNTHETIC_PARAMETERS:
        raise ValueError(
            f"config {config_name} has {parameters:,} parameters: a synthetic checkpoint drawn on the CPU is for "
            f"configs of at most {MAX_SYNTHETIC_PARAMETERS:,} (tiny, small, demo); draw it on a GPU (device "
            f"cuda), or serve {config_name} without a file with --checkpoint random:0"
        )
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} exists and is not empty; choose a new folder")
    if torch.device(device).type == "cuda":
        use_bitwise_cublas()  # H3DiT refuses CUDA without it (no GEMM runs here)
    dit = H3DiT(cfg, device=device)
    init_weights(dit, seed)
    save_official_transformer(dit, folder, SHARD_BYTES)
    del dit  # its memory is the text encoder's next
    write_random_qwen3vl(folder / TEXT_ENCODER, dims, seed, device)
    write_byte_tokenizer(folder / TOKENIZER)
    write_official_vaes(folder, *create_vaes(seed + VAE_SEED_OFFSET))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m h3_core.weights.official_checkpoint",
        description="Write a synthetic official-layout checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("folder", type=Path, help="new (or empty) folder to write")
    parser.add_argument("--config", default="tiny", help="DiT config (h3_core.config): its sizes and text width")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random weight")
    parser.add_argument(
        "--text-encoder",
        choices=TEXT_ENCODERS,
        default="tiny",
        help="the Qwen3-VL's sizes: tiny (of the DiT's text width) or h3 (MiniMax-H3's real ones)",
    )
    parser.add_argument(
        "--text-encoder-layers", type=int, default=QWEN3VL_LAYERS, help="its decoder layers (serve at most this many)"
    )
    parser.add_argument("--device", default="cpu", help="where the weights are drawn (cpu, cuda, cuda:N)")
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device: choose cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        parser.error(f"--device {args.device}: choose cpu, or cuda / cuda:N on a machine with a CUDA GPU")
    try:
        folder = write_synthetic_checkpoint(
            args.folder, args.config, args.seed, args.text_encoder, args.text_encoder_layers, args.device
        )
    except (ValueError, FileExistsError) as error:
        parser.exit(2, f"python -m h3_core.weights.official_checkpoint: {error}\n")
    print(f"synthetic official checkpoint ({args.config}, seed {args.seed}) written to {folder}")
    cut = args.text_encoder_layers < QWEN3VL_H3_LAYER  # served at hidden_layer 50 unless told
    layers = f" --set h3_encoder.hidden_layer={args.text_encoder_layers}" if cut else ""
    gpus = " --device cuda --gpus all" if device.type == "cuda" else ""
    print(
        f"serve it: python -m server.launch{gpus} --config {args.config} --checkpoint {folder} "
        f"--set h3_vae.trust_remote_code=true{layers}"
    )


if __name__ == "__main__":
    main()
