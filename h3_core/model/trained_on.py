"""What a checkpoint's weights were trained on (TrainingMetadata: the trained sizes and caption
words, from its training.json, read by h3_core.weights.training_metadata), and the checks that put
"outside_training" in a result's INFO: h3_dit checks the sizes, h3_encoder the prompt's words."""

import re
from dataclasses import dataclass

WORD = re.compile(r"\w+(?:'\w+)*")  # a prompt's words: letters / digits, inner apostrophes kept
SIZE_FIELDS = ("height", "width", "num_frames")


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
