"""What a checkpoint's weights were trained on, shipped beside them as TRAINING_FILE (optional).

training.json holds one JSON object (training.export writes the demo's from training.data):

- "height", "width", "num_frames": lists of the trained canvas heights and widths (pixels) and
  clip lengths (frames);
- "caption": the caption template, e.g. "a {colour} {shape} {verb} {direction} while a {pitch}
  tone plays on the {side}" (shown to people; not used in a check);
- "words": every word of the training captions (lower case).

h3_dit reads it at load and h3_encoder from the same checkpoint folder; a request outside it is
still served, and its result's INFO carries "outside_training": the size and length that differ
(h3_dit: "height 128 (trained: 64)") and the prompt's unknown words (h3_encoder, which alone
sees the prompt: "words: 'dragon', 'flies'"). Weights without the file (checkpoint_setup's,
`random:SEED`) give no such field.

TrainingMetadata holds the file's values (`from_fields` checks them) and the checks that put
"outside_training" in a result's INFO: h3_dit checks the sizes (outside_size), h3_encoder the
prompt's words (outside_words). weights.checkpoint.load_training_metadata reads the file beside the
weights (the serving rooms may import the model, not the weights).
"""

import re
from dataclasses import dataclass
from pathlib import Path

WORD = re.compile(r"\w+(?:'\w+)*")  # a prompt's words: letters / digits, inner apostrophes kept
SIZE_FIELDS = ("height", "width", "num_frames")
TRAINING_FILE = "training.json"


def prompt_words(text: str) -> list[str]:
    """The words of `text`, case-folded, in order (WORD)."""
    return WORD.findall(text.casefold())


@dataclass(frozen=True)
class TrainingMetadata:
    """A checkpoint's training.json (module docstring): trained sizes per SIZE_FIELDS (pixels,
    frames), the caption template and the vocabulary."""

    sizes: dict[str, tuple[int, ...]]
    caption: str
    words: frozenset[str]

    def outside_size(self, height: int, width: int, num_frames: int) -> list[str]:
        """One entry per SIZE_FIELDS value not trained on, e.g. "height 128 (trained: 64)"."""
        values = {"height": height, "width": width, "num_frames": num_frames}
        return [
            f"{name} {values[name]} (trained: {', '.join(map(str, self.sizes[name]))})"
            for name in SIZE_FIELDS
            if values[name] not in self.sizes[name]
        ]

    def outside_words(self, prompt: str) -> list[str]:
        """[] when every word of `prompt` is in the vocabulary, else one entry naming the unknown
        words once each in order of appearance, e.g. "words: 'dragon', 'flies'"."""
        unknown = [word for word in dict.fromkeys(prompt_words(prompt)) if word not in self.words]
        return [f"words: {', '.join(map(repr, unknown))}"] if unknown else []

    @classmethod
    def from_fields(cls, fields: dict, path: Path) -> "TrainingMetadata":
        """The TrainingMetadata of TRAINING_FILE's JSON object `fields` (read from `path`, named in
        errors). Raises ValueError naming the file and the key when a size list is not a non-empty
        list of positive integers, "caption" not a string or "words" not a list of strings."""
        sizes = {}
        for name in SIZE_FIELDS:
            values = fields.get(name)
            if not (isinstance(values, list) and values and all(type(v) is int and v > 0 for v in values)):
                raise ValueError(f"{path}: {name!r} must be a non-empty list of positive integers, got {values!r}")
            sizes[name] = tuple(values)
        caption, words = fields.get("caption"), fields.get("words")
        if not isinstance(caption, str):
            raise ValueError(f"{path}: 'caption' must be a string, got {caption!r}")
        if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
            raise ValueError(f"{path}: 'words' must be a list of strings, got {words!r}")
        return cls(sizes, caption, frozenset(w.casefold() for w in words))
