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
"""

from pathlib import Path

from ..model.trained_on import SIZE_FIELDS, TrainingMetadata
from .checkpoint import read_json_object, source_seed

TRAINING_FILE = "training.json"


def load_training_metadata(source: str | Path) -> TrainingMetadata | None:
    """The TRAINING_FILE of a weight source folder, or None (no file, or `random:SEED`).

    Raises ValueError naming the file and the key when it is not JSON, or a size list is not a
    non-empty list of positive integers, "caption" not a string or "words" not a list of strings."""
    if source_seed(source) is not None or not (Path(source) / TRAINING_FILE).is_file():
        return None
    path = Path(source) / TRAINING_FILE
    fields = read_json_object(path)
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
    return TrainingMetadata(sizes, caption, frozenset(w.casefold() for w in words))
