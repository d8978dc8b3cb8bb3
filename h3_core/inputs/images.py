"""Keyframe images for fl2va (KEYFRAMES on the wire): strict, bounded decoding of the uploaded files,
the canvas a request's keyframes choose, and how a keyframe is fitted to that canvas.

No torch here: numpy and Pillow only. Images are uint8 RGB numpy arrays [H, W, 3] (rows, columns,
channels). Every refusal of a file is a ValueError whose message names the input (e.g.
"KEYFRAMES[1]"), the limit and what was found, so the encoder can pass it on as INVALID_ARG.

Decoding order (decode_image): the byte count, the format from the file's signature, the size from
the header (before any pixel is decoded: a small file declaring 20000 x 20000 pixels is refused
there, docs/failure_classes.md §K4), animation, then the pixels, the EXIF orientation (K2) and the
conversion to RGB (16-bit greyscale keeps its levels, K3; alpha is composited over BACKGROUND).
"""

import io
import math
import struct
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFile, ImageOps

from h3_core import config

FORMATS = ("PNG", "JPEG", "WEBP")  # the formats decode_image accepts (Pillow's names)
# Transparent pixels are composited over this colour (RGB, black); "pad" fills the canvas with it.
BACKGROUND = (0, 0, 0)
PAD_COLOR = BACKGROUND
RESAMPLE = Image.Resampling.LANCZOS  # the reference implementation's resampling filter
SIXTEEN_BIT_GREY = ("I;16", "I;16B", "I;16L", "I")  # Pillow's modes of 16-bit greyscale data
KEYED_MODES = ("1", "L", "P", "RGB")  # modes that may carry a transparency key (info["transparency"])
ALPHA_MODES = ("LA", "PA", "RGBA")


@dataclass(frozen=True)
class ImageLimits:
    """What decode_image accepts.

    max_bytes: the file's size in bytes (32 MiB). max_pixels: width x height (40 megapixels); at
    most Pillow's own decompression-bomb limit PIL.Image.MAX_IMAGE_PIXELS, so Pillow never refuses
    an image these limits allow. min_side, max_side: each side in pixels (32..8192). max_aspect:
    long side / short side (4.0). The limits are symmetric in width and height, so the EXIF
    orientation never changes the verdict. Raises ValueError for a limit out of its range.
    """

    max_bytes: int = 32 * 1024 * 1024
    max_pixels: int = 40_000_000
    min_side: int = 32
    max_side: int = 8192
    max_aspect: float = 4.0

    def __post_init__(self):
        if self.max_bytes < 1:
            raise ValueError(f"ImageLimits.max_bytes must be >= 1, got {self.max_bytes}")
        if not 1 <= self.min_side <= self.max_side:
            raise ValueError(f"ImageLimits needs 1 <= min_side <= max_side, got {self.min_side}, {self.max_side}")
        bomb = Image.MAX_IMAGE_PIXELS
        if self.max_pixels < self.min_side**2 or (bomb is not None and self.max_pixels > bomb):
            raise ValueError(
                f"ImageLimits.max_pixels must be within min_side^2..PIL.Image.MAX_IMAGE_PIXELS = "
                f"{self.min_side**2}..{bomb}, got {self.max_pixels}"
            )
        if not self.max_aspect >= 1.0:
            raise ValueError(f"ImageLimits.max_aspect must be >= 1.0, got {self.max_aspect}")


def size_problem(
    width: int,
    height: int,
    stored: str,
    min_side: int,
    max_side: int,
    max_pixels: tuple[str, int],
    max_aspect: float,
) -> str | None:
    """What is wrong with a picture of width x height pixels (an image, a video's frames), or
    None: a side outside min_side..max_side, more pixels than max_pixels (its limit's name and
    value), or an aspect (long side / short side) over max_aspect. `stored` qualifies the size
    in the message ("as stored": before an EXIF rotation)."""
    size = f"{width}x{height} px (width x height{' ' + stored if stored else ''})"
    if not min_side <= min(width, height) <= max(width, height) <= max_side:
        return f"is {size}; each side must be within min_side..max_side = {min_side}..{max_side} px"
    name, limit = max_pixels
    if width * height > limit:
        return f"is {size} = {width * height} pixels, over {name} {limit}"
    aspect = max(width, height) / min(width, height)
    if aspect > max_aspect:
        return f"is {size}, aspect {aspect:.2f} (long side / short side), over max_aspect {max_aspect}"
    return None


def _format_found(prefix: bytes) -> str | None:
    """The Pillow format whose signature `prefix` (a file's first 16 bytes) matches, FORMATS tried
    first, or None. Runs each plugin's signature test only (no plugin parses the file) and, as
    PIL.Image.open does, takes a test that fails on a short prefix for a mismatch."""
    Image.init()
    for name in FORMATS + tuple(name for name in Image.OPEN if name not in FORMATS):
        accept = Image.OPEN[name][1]
        try:
            if accept is not None and accept(prefix) is True:
                return name
        except (SyntaxError, IndexError, TypeError, struct.error):
            continue
    return None


def _open(data: bytes, field: str, limits: ImageLimits) -> Image.Image:
    """Open `data` lazily (header only) and check everything the header tells; see decode_image."""
    if not data:
        raise ValueError(f"{field}: is empty (0 bytes); expected a {', '.join(FORMATS)} file")
    if len(data) > limits.max_bytes:
        raise ValueError(f"{field}: is {len(data)} bytes, over max_bytes {limits.max_bytes}")
    found = _format_found(data[:16])
    found = "JPEG" if found == "MPO" else found
    if found not in FORMATS:
        what = f"a {found} image" if found else "not an image (no known file signature)"
        raise ValueError(f"{field}: is {what}; the allowed formats are {', '.join(FORMATS)}")
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ValueError(
            f"{field}: refused from its header as a decompression bomb (over max_pixels {limits.max_pixels}): {error}"
        ) from None
    except (OSError, ValueError, EOFError) as error:  # Pillow's repr of the stream is no use to the client
        raise ValueError(f"{field}: is not a complete {found} image: its header cannot be read") from error
    width, height = image.size
    problem = size_problem(
        width,
        height,
        "as stored",
        limits.min_side,
        limits.max_side,
        ("max_pixels", limits.max_pixels),
        limits.max_aspect,
    )
    if problem is not None:
        raise ValueError(f"{field}: {problem}")
    frames = getattr(image, "n_frames", 1)
    if image.format != "MPO" and frames > 1:
        raise ValueError(f"{field}: is an animated {image.format} of {frames} frames; only still images are allowed")
    return image


def _composite(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """rgb uint8 [H, W, 3] with alpha (0..255) [H, W] over BACKGROUND: round((c a + b (255 - a)) / 255)
    per channel, exactly (255 is odd, so (x + 127) // 255 rounds every x / 255 to the nearest). In
    uint16: x + 127 <= 255 x 255 + 127 < 2^16."""
    a = alpha.astype(np.uint16)[..., None]
    out = rgb.astype(np.uint16) * a + np.asarray(BACKGROUND, np.uint16) * (255 - a)
    return ((out + 127) // 255).astype(np.uint8)


def _rgb(image: Image.Image, field: str) -> np.ndarray:
    """The pixels of a loaded image as uint8 RGB [H, W, 3]; see decode_image for the modes."""
    mode, key = image.mode, image.info.get("transparency")
    if mode in SIXTEEN_BIT_GREY:
        grey = np.asarray(image).astype(np.int32)  # I;16B is big-endian: numpy reads it right
        if grey.size and (grey.min() < 0 or grey.max() > 65535):
            raise ValueError(f"{field}: {mode} levels must be within 0..65535, found {grey.min()}..{grey.max()}")
        rgb = np.repeat(((grey * 255 + 32767) // 65535).astype(np.uint8)[..., None], 3, axis=2)
        return rgb if key is None else _composite(rgb, np.where(grey == key, 0, 255))
    if mode == "CMYK" or (mode in KEYED_MODES and key is None):
        return np.asarray(image.convert("RGB"))
    if mode in KEYED_MODES + ALPHA_MODES:
        rgba = np.asarray(image.convert("RGBA"))
        return _composite(rgba[..., :3], rgba[..., 3])
    allowed = ", ".join(SIXTEEN_BIT_GREY + ("CMYK",) + KEYED_MODES + ALPHA_MODES)
    raise ValueError(f"{field}: has Pillow pixel mode {mode}, which is not supported (allowed: {allowed})")


def decode_image(data: bytes, field: str, limits: ImageLimits) -> np.ndarray:
    """Decode one uploaded image file into uint8 RGB [H, W, 3], upright (EXIF orientation applied).

    `field` names the input in every message (e.g. "KEYFRAMES[1]"). Refusals, each a ValueError
    naming the field, the limit and what was found, in this order:
    - empty data, or more than limits.max_bytes bytes (before Pillow sees it);
    - a format other than FORMATS (PNG, JPEG, WEBP), from the file's signature: GIF, BMP, TIFF, or
      no image at all. An MPO (a JPEG with further pictures, as cameras write) is a JPEG: its
      primary picture is decoded;
    - from the header, before any pixel is decoded: a side outside limits.min_side..max_side,
      width x height over limits.max_pixels, long side / short side over limits.max_aspect (the
      limits are symmetric in width and height, so this verdict is the one on the upright image;
      messages give the size as stored, before the EXIF orientation). Pillow's
      DecompressionBombError (and its DecompressionBombWarning, where warnings are errors) become
      the same ValueError;
    - an animated PNG (APNG) or WebP (n_frames > 1): no first frame is taken silently;
    - truncated or corrupt pixel data: "<field>: is not a complete <format> image: <Pillow's reason>".

    Conversion to RGB by Pillow mode: RGB as is; 1, L, P -> RGB; CMYK (JPEG, Adobe-inverted included)
    by Pillow's conversion; 16-bit greyscale (I;16, I;16B, I;16L, I) scaled by 255 / 65535 with
    rounding (a 16-bit ramp keeps its levels; Pillow's own conversion clips, docs/failure_classes.md §K3);
    RGBA, LA, PA, and 1/L/P/RGB/16-bit grey with a transparency key, composited over BACKGROUND
    (black) as round((c a + b (255 - a)) / 255). Any other mode (F, YCbCr, LAB, ...; none of them
    comes from a PNG, JPEG or WebP file) is refused with a ValueError listing the supported modes.

    Raises RuntimeError when PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this process (truncated
    files would then decode with filler instead of being refused).
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set: truncated images would not be refused")
    with _open(data, field, limits) as image:
        found = "JPEG" if image.format == "MPO" else image.format
        try:
            image.load()
            ImageOps.exif_transpose(image, in_place=True)
        except (OSError, SyntaxError, EOFError, ValueError, struct.error) as error:
            raise ValueError(f"{field}: is not a complete {found} image: {error}") from error
        return _rgb(image, field)


def fit_image(image: np.ndarray, height: int, width: int, fit: str) -> np.ndarray:
    """Fit uint8 RGB [h, w, 3] to the canvas: uint8 RGB [height, width, 3] (pixels).

    fit (config.FITS): "crop" scales to cover the canvas and keeps the centre (PIL.ImageOps.fit);
    "pad" scales to fit inside, centred, the rest PAD_COLOR (PIL.ImageOps.pad); "stretch" resizes
    to the canvas whatever the aspect. Resampling is RESAMPLE (LANCZOS). An image already of the
    canvas size is returned as it is (the same array, whatever `fit`). Raises ValueError for an
    unknown fit (the message lists FITS), an image that is not uint8 [h, w, 3] or a side < 1.
    """
    if fit not in config.FITS:
        raise ValueError(f"fit must be one of {', '.join(config.FITS)}, got {fit!r}")
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
        raise ValueError(f"image must be uint8 [h, w, 3] with h, w >= 1, got {image.dtype} {list(image.shape)}")
    if height < 1 or width < 1:
        raise ValueError(f"the canvas needs height, width >= 1, got {height}x{width}")
    if image.shape[:2] == (height, width):
        return image
    source, size = Image.fromarray(image), (width, height)
    if fit == "crop":
        fitted = ImageOps.fit(source, size, method=RESAMPLE)
    elif fit == "pad":
        fitted = ImageOps.pad(source, size, method=RESAMPLE, color=PAD_COLOR)
    else:
        fitted = source.resize(size, RESAMPLE)
    return np.asarray(fitted)


def _side(value: float, maximum: int) -> int:
    """value rounded to the nearest multiple of CANVAS_MULTIPLE (halves up), within
    CANVAS_MULTIPLE..maximum rounded down to a multiple."""
    multiple = config.CANVAS_MULTIPLE
    return max(multiple, min(math.floor(value / multiple + 0.5) * multiple, maximum // multiple * multiple))


def canvas_for_image(
    image_height: int,
    image_width: int,
    area: int,
    max_height: int,
    max_width: int,
    height: int | None = None,
    width: int | None = None,
) -> tuple[int, int]:
    """The canvas (height, width) in pixels for a keyframe of image_height x image_width pixels.

    - HEIGHT and WIDTH both given: (height, width) as given;
    - one given: it stays as given; the other follows the image's aspect (image_width /
      image_height);
    - none: the image's aspect at about `area` pixels (the model's default canvas area):
      height = sqrt(area / aspect), width = sqrt(area x aspect), both scaled down together when
      one is over its maximum (the aspect is kept as well as the rounding allows).
    A computed side is rounded to the nearest multiple of config.CANVAS_MULTIPLE (32; halves up),
    at least 32 and at most its maximum rounded down to a multiple of 32. The request's own HEIGHT
    and WIDTH are not range-checked here (the DiT's validate_request does). Example: a 1920 x 1080
    (width x height) image at area 96 x 64 -> (64, 96). Raises ValueError when an image side or area
    is < 1 or a maximum is < CANVAS_MULTIPLE.
    """
    if min(image_height, image_width, area) < 1:
        raise ValueError(f"image sides and area must be >= 1, got {image_height}x{image_width}, area {area}")
    if min(max_height, max_width) < config.CANVAS_MULTIPLE:
        raise ValueError(f"max_height, max_width must be >= {config.CANVAS_MULTIPLE}, got {max_height}, {max_width}")
    aspect = image_width / image_height
    if height is not None and width is not None:
        return height, width
    if height is not None:
        return height, _side(height * aspect, max_width)
    if width is not None:
        return _side(width / aspect, max_height), width
    exact_height, exact_width = math.sqrt(area / aspect), math.sqrt(area * aspect)
    scale = min(1.0, max_height / exact_height, max_width / exact_width)
    return _side(exact_height * scale, max_height), _side(exact_width * scale, max_width)
