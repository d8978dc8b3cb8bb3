"""What the content route serves besides the files as written: a spritesheet made from the MP4
(OpenAI's `variant=spritesheet`), and file responses whose Range handling follows RFC 9110.

Spritesheet: a JPEG grid of SPRITE_FRAMES frames (fewer for a shorter clip) taken evenly from
the first to the last frame, left to right then top to bottom, in a grid ceil(sqrt(count))
columns wide; a tile is the frame scaled to at most SPRITE_TILE_WIDTH pixels wide, its aspect
kept (a 96x64 clip: 16 tiles of 96x64 in 4 x 4, a 384x256 JPEG).
"""

from __future__ import annotations

import io
import math

import av
from PIL import Image
from starlette.responses import FileResponse, MalformedRangeHeader

SPRITE_FRAMES = 16
SPRITE_TILE_WIDTH = 256
SPRITE_QUALITY = 90  # JPEG quality


def sprite_indices(num_frames: int, count: int = SPRITE_FRAMES) -> list[int]:
    """The frames a spritesheet shows: min(count, num_frames) indices spread evenly over
    0..num_frames - 1, both ends included (rounded halves to even). Raises ValueError for
    num_frames < 1."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    count = min(count, num_frames)
    if count == 1:
        return [0]
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def spritesheet_bytes(mp4: bytes) -> bytes:
    """The spritesheet JPEG (module docstring) of an MP4 file (PyAV decodes it, Pillow draws the
    grid). Raises av.error.FFmpegError for bytes that are not a video, ValueError for a video
    without frames."""
    with av.open(io.BytesIO(mp4)) as container:
        frames = [frame.to_image() for frame in container.decode(video=0)]
    chosen = [frames[i] for i in sprite_indices(len(frames))]
    width, height = chosen[0].size
    scale = min(1.0, SPRITE_TILE_WIDTH / width)
    tile = (max(1, round(width * scale)), max(1, round(height * scale)))
    columns = math.ceil(math.sqrt(len(chosen)))
    rows = math.ceil(len(chosen) / columns)
    sheet = Image.new("RGB", (columns * tile[0], rows * tile[1]))
    for k, frame in enumerate(chosen):
        image = frame if frame.size == tile else frame.resize(tile, Image.Resampling.LANCZOS)
        sheet.paste(image, ((k % columns) * tile[0], (k // columns) * tile[1]))
    buffer = io.BytesIO()
    sheet.save(buffer, "JPEG", quality=SPRITE_QUALITY)
    return buffer.getvalue()


class MediaFile(FileResponse):
    """Starlette's FileResponse (Range, If-Range, HEAD, multipart/byteranges, 416 for a range
    past the end), except that a Range it cannot use is ignored as RFC 9110 section 14.2 says: a
    unit other than bytes (`items=0-5`) or a malformed byte range (`bytes=x-`, `bytes=5-2`)
    answers 200 with the whole file, never 400."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except MalformedRangeHeader:
            return []  # FileResponse sends the whole file
