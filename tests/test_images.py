"""h3_core.inputs.images: keyframe decoding (every refusal's exact message, exact pixels for each mode),
fit_image and canvas_for_image. Every image is built here with Pillow, numpy or zlib."""

import io
import re
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from h3_core.inputs.images import BACKGROUND, ImageLimits, _rgb, canvas_for_image, decode_image, fit_image

FIELD = "KEYFRAMES[1]"
LIMITS = ImageLimits()
ALLOWED = "the allowed formats are PNG, JPEG, WEBP"
SIDES = "each side must be within min_side..max_side = 32..8192 px"


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR declares width x height RGB pixels, with one tiny IDAT (a few bytes)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def refused(data: bytes, limits: ImageLimits = LIMITS) -> str:
    with pytest.raises(ValueError) as caught:
        decode_image(data, FIELD, limits)
    return str(caught.value)


# Refusals before any pixel is decoded


def test_empty_bytes_are_refused():
    assert refused(b"") == f"{FIELD}: is empty (0 bytes); expected a PNG, JPEG, WEBP file"


def test_over_max_bytes_is_refused_before_pillow():
    data = encode(Image.fromarray(noise(32, 32)), "PNG")
    assert refused(data, ImageLimits(max_bytes=1000)) == f"{FIELD}: is {len(data)} bytes, over max_bytes 1000"
    # the byte limit comes first: even text over it is refused for its size
    assert refused(b"x" * 1001, ImageLimits(max_bytes=1000)) == f"{FIELD}: is 1001 bytes, over max_bytes 1000"


def test_text_is_not_an_image():
    # one byte: shorter than some plugins' signature tests read (BMP's DIB test unpacks 4 bytes)
    for data in (b"not an image, just some text\n", b"_"):
        assert refused(data) == f"{FIELD}: is not an image (no known file signature); {ALLOWED}"


@pytest.mark.parametrize("fmt", ["GIF", "BMP", "TIFF"])
def test_other_formats_are_refused(fmt):
    data = encode(Image.fromarray(noise(48, 64)), fmt)
    assert refused(data) == f"{FIELD}: is a {fmt} image; {ALLOWED}"


def test_animated_gif_is_refused_for_its_format():
    frames = [Image.fromarray(noise(48, 64, seed)) for seed in range(3)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert refused(data) == f"{FIELD}: is a GIF image; {ALLOWED}"


def test_bomb_declared_in_the_header_is_refused_before_decoding():
    """A 100-byte PNG declaring 20000 x 20000 pixels (K4): Pillow's bomb check refuses it from the IHDR."""
    data = png_header_only(20000, 20000)
    assert len(data) < 100
    assert refused(data) == (
        f"{FIELD}: refused from its header as a decompression bomb (over max_pixels 40000000): Image size "
        "(400000000 pixels) exceeds limit of 178956970 pixels, could be decompression bomb DOS attack."
    )


def test_sides_and_pixels_are_checked_from_the_header():
    assert refused(png_header_only(9000, 9000)) == (f"{FIELD}: is 9000x9000 px (width x height as stored); {SIDES}")
    assert refused(png_header_only(8000, 6000)) == (
        f"{FIELD}: is 8000x6000 px (width x height as stored) = 48000000 pixels, over max_pixels 40000000"
    )


def test_pillows_bomb_warning_range_is_refused_by_max_pixels():
    """10000 x 9000 = 90 M pixels: over Pillow's MAX_IMAGE_PIXELS (a warning there), over max_pixels here."""
    limits = ImageLimits(max_side=10000, max_pixels=Image.MAX_IMAGE_PIXELS)
    with pytest.warns(Image.DecompressionBombWarning):
        message = refused(png_header_only(10000, 9000), limits)
    assert message == (
        f"{FIELD}: is 10000x9000 px (width x height as stored) = 90000000 pixels, "
        f"over max_pixels {Image.MAX_IMAGE_PIXELS}"
    )


def test_one_pixel_is_refused():
    data = encode(Image.new("RGB", (1, 1)), "PNG")
    assert refused(data) == f"{FIELD}: is 1x1 px (width x height as stored); {SIDES}"


def test_aspect_five_to_one_is_refused():
    data = encode(Image.fromarray(noise(32, 160)), "PNG")
    assert refused(data) == (
        f"{FIELD}: is 160x32 px (width x height as stored), aspect 5.00 (long side / short side), over max_aspect 4.0"
    )
    assert decode_image(data, FIELD, ImageLimits(max_aspect=5.0)).shape == (32, 160, 3)


def test_animated_png_and_webp_are_refused():
    frames = [Image.fromarray(noise(48, 64, seed)) for seed in range(2)]
    for fmt in ("PNG", "WEBP"):
        data = encode(frames[0], fmt, save_all=True, append_images=frames[1:])
        assert refused(data) == f"{FIELD}: is an animated {fmt} of 2 frames; only still images are allowed"


# Truncated data


def test_truncated_png_is_refused():
    data = encode(Image.fromarray(noise(48, 64)), "PNG")
    assert refused(data[: len(data) // 2]) == f"{FIELD}: is not a complete PNG image: image file is truncated"
    assert refused(data[:20]) == f"{FIELD}: is not a complete PNG image: its header cannot be read"


def test_truncated_jpeg_is_refused():
    data = encode(Image.fromarray(noise(48, 64)), "JPEG")
    message = refused(data[: len(data) // 2])
    assert re.fullmatch(
        re.escape(f"{FIELD}: is not a complete JPEG image: image file is truncated (") + r"\d+ bytes not processed\)",
        message,
    ), message


def test_load_truncated_images_set_elsewhere_is_a_runtime_error(monkeypatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES is set"):
        decode_image(encode(Image.fromarray(noise(48, 64)), "PNG"), FIELD, LIMITS)


# Pixels


def test_rgb_png_and_lossless_webp_decode_exactly():
    pixels = noise(48, 64)
    for fmt, options in (("PNG", {}), ("WEBP", {"lossless": True})):
        decoded = decode_image(encode(Image.fromarray(pixels), fmt, **options), FIELD, LIMITS)
        assert decoded.dtype == np.uint8
        np.testing.assert_array_equal(decoded, pixels)


def test_greyscale_and_bilevel_become_grey_rgb():
    grey = noise(48, 64)[..., 0]
    decoded = decode_image(encode(Image.fromarray(grey), "PNG"), FIELD, LIMITS)
    np.testing.assert_array_equal(decoded, np.repeat(grey[..., None], 3, axis=2))
    bilevel = Image.fromarray(grey).convert("1")
    decoded = decode_image(encode(bilevel, "PNG"), FIELD, LIMITS)
    np.testing.assert_array_equal(decoded, np.repeat(np.asarray(bilevel.convert("L"))[..., None], 3, axis=2))


def test_16_bit_grey_ramp_keeps_its_levels():
    """K3: level k x 257 -> k exactly (round(v x 255 / 65535)); 128 / 257 rounds to 0, 129 / 257 to 1."""
    ramp = np.tile(np.arange(256, dtype=np.uint16) * 257, (64, 1))
    ramp[0, :4] = (128, 129, 65534, 65535)
    image = Image.fromarray(ramp)
    assert image.mode == "I;16"
    decoded = decode_image(encode(image, "PNG"), FIELD, LIMITS)
    expected = np.tile(np.arange(256, dtype=np.uint8), (64, 1))
    expected[0, :4] = (0, 1, 255, 255)
    np.testing.assert_array_equal(decoded, np.repeat(expected[..., None], 3, axis=2))


def test_rgba_is_composited_over_black():
    pixels = np.zeros((32, 32, 4), np.uint8)
    pixels[0, 0] = (200, 100, 50, 128)  # half transparent: round(c x 128 / 255)
    pixels[0, 1] = (255, 255, 255, 128)
    pixels[0, 2] = (10, 20, 30, 255)
    pixels[0, 3] = (90, 90, 90, 0)
    decoded = decode_image(encode(Image.fromarray(pixels), "PNG"), FIELD, LIMITS)
    assert BACKGROUND == (0, 0, 0)
    assert decoded[0, :4].tolist() == [[100, 50, 25], [128, 128, 128], [10, 20, 30], [0, 0, 0]]
    webp = decode_image(encode(Image.fromarray(pixels), "WEBP", lossless=True, exact=True), FIELD, LIMITS)
    np.testing.assert_array_equal(webp, decoded)


def test_greyscale_with_alpha_is_composited_over_black():
    pixels = np.zeros((32, 32, 2), np.uint8)
    pixels[0, :3] = [(200, 128), (200, 255), (200, 0)]
    decoded = decode_image(encode(Image.fromarray(pixels, "LA"), "PNG"), FIELD, LIMITS)
    assert decoded[0, :3].tolist() == [[100] * 3, [200] * 3, [0] * 3]


def palette_image() -> Image.Image:
    image = Image.fromarray(np.tile(np.arange(4, dtype=np.uint8), (32, 8)), "P")
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 200, 100, 50])
    return image


def test_palette_without_transparency():
    decoded = decode_image(encode(palette_image(), "PNG"), FIELD, LIMITS)
    assert decoded.shape == (32, 32, 3)
    assert decoded[5, :4].tolist() == [[255, 0, 0], [0, 255, 0], [0, 0, 255], [200, 100, 50]]


def test_palette_with_transparency():
    data = encode(palette_image(), "PNG", transparency=bytes([255, 0, 255, 128]))  # alpha per index
    decoded = decode_image(data, FIELD, LIMITS)
    assert decoded[5, :4].tolist() == [[255, 0, 0], [0, 0, 0], [0, 0, 255], [100, 50, 25]]


def test_transparency_keys_of_grey_rgb_and_16_bit_grey():
    grey = np.full((32, 32), 100, np.uint8)
    grey[0, 0] = 7
    decoded = decode_image(encode(Image.fromarray(grey), "PNG", transparency=7), FIELD, LIMITS)
    assert decoded[0, :2].tolist() == [[0, 0, 0], [100, 100, 100]]
    rgb = np.full((32, 32, 3), 9, np.uint8)
    rgb[0, 0] = (1, 2, 3)
    decoded = decode_image(encode(Image.fromarray(rgb), "PNG", transparency=(1, 2, 3)), FIELD, LIMITS)
    assert decoded[0, :2].tolist() == [[0, 0, 0], [9, 9, 9]]
    wide = np.full((32, 32), 257 * 40, np.uint16)
    wide[0, 0] = 1234
    decoded = decode_image(encode(Image.fromarray(wide), "PNG", transparency=1234), FIELD, LIMITS)
    assert decoded[0, :2].tolist() == [[0, 0, 0], [40, 40, 40]]


def test_cmyk_jpeg_comes_back_close_to_its_rgb_source():
    """Flat 8 x 8-aligned patches: each JPEG block holds only its DC coefficient, whose quantiser step
    at quality 95 is 2 levels, so every channel returns within 2 levels of the source (no chroma
    subsampling for CMYK). Pillow writes the Adobe marker and inverted CMYK."""
    colours = np.array([[255, 0, 0], [0, 128, 255], [30, 200, 90], [250, 250, 250]], np.uint8)
    source = np.repeat(np.repeat(colours.reshape(2, 2, 3), 16, axis=0), 16, axis=1)
    data = encode(Image.fromarray(source).convert("CMYK"), "JPEG", quality=95)
    assert b"Adobe" in data[:200]
    decoded = decode_image(data, FIELD, LIMITS)
    assert decoded.shape == (32, 32, 3)
    assert np.abs(decoded.astype(int) - source).max() <= 2


def test_exif_orientation_6_is_applied():
    """K2: Orientation 6 (the camera was turned 90 degrees clockwise) decodes to the plain JPEG's
    pixels turned 90 degrees clockwise, exactly (the same compressed picture, with and without EXIF)."""
    source = Image.fromarray(noise(48, 64))
    exif = Image.Exif()
    exif[0x0112] = 6
    plain = decode_image(encode(source, "JPEG", quality=90), FIELD, LIMITS)
    turned = decode_image(encode(source, "JPEG", quality=90, exif=exif.tobytes()), FIELD, LIMITS)
    assert plain.shape == (48, 64, 3) and turned.shape == (64, 48, 3)
    np.testing.assert_array_equal(turned, np.rot90(plain, k=-1))


def test_mpo_decodes_its_primary_picture():
    first, second = Image.fromarray(noise(48, 64, 1)), Image.fromarray(noise(48, 64, 2))
    data = encode(first, "MPO", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(data)).format == "MPO"
    expected = decode_image(encode(first, "JPEG"), FIELD, LIMITS)
    np.testing.assert_array_equal(decode_image(data, FIELD, LIMITS), expected)


def test_other_modes_and_out_of_range_levels_are_refused():
    with pytest.raises(ValueError, match=re.escape(f"{FIELD}: has Pillow pixel mode F, which is not supported")):
        _rgb(Image.new("F", (32, 32)), FIELD)
    wide = Image.fromarray(np.full((32, 32), 70000, np.int32))
    assert wide.mode == "I"
    with pytest.raises(ValueError, match=re.escape(f"{FIELD}: I levels must be within 0..65535, found 70000..70000")):
        _rgb(wide, FIELD)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_bytes": 0}, "ImageLimits.max_bytes must be >= 1, got 0"),
        ({"min_side": 64, "max_side": 32}, "ImageLimits needs 1 <= min_side <= max_side, got 64, 32"),
        ({"max_pixels": 100}, "ImageLimits.max_pixels must be within min_side^2..PIL.Image.MAX_IMAGE_PIXELS"),
        ({"max_pixels": 10**9}, "ImageLimits.max_pixels must be within min_side^2..PIL.Image.MAX_IMAGE_PIXELS"),
        ({"max_aspect": 0.5}, "ImageLimits.max_aspect must be >= 1.0, got 0.5"),
    ],
)
def test_image_limits_are_validated(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ImageLimits(**options)


# fit_image


def columns() -> np.ndarray:
    """[2, 4, 3]: four flat columns of distinct colours."""
    colours = np.array([[10, 20, 30], [40, 50, 60], [70, 80, 90], [100, 110, 120]], np.uint8)
    return np.ascontiguousarray(np.broadcast_to(colours, (2, 4, 3)))


def test_crop_keeps_the_centre():
    np.testing.assert_array_equal(fit_image(columns(), 2, 2, "crop"), columns()[:, 1:3])


def test_pad_centres_the_image_on_black():
    padded = fit_image(columns(), 4, 4, "pad")
    np.testing.assert_array_equal(padded[1:3], columns())
    assert padded[[0, 3]].max() == 0


def test_stretch_resizes_to_the_canvas_whatever_the_aspect():
    halves = np.zeros((4, 2, 3), np.uint8)
    halves[:2], halves[2:] = (200, 10, 10), (10, 10, 200)
    stretched = fit_image(halves, 4, 8, "stretch")
    np.testing.assert_array_equal(stretched, np.repeat(halves[:, :1], 8, axis=1))


@pytest.mark.parametrize("fit", ["crop", "pad", "stretch"])
def test_fit_shapes_and_identity(fit):
    image = noise(48, 64)
    for height, width in ((32, 96), (96, 32), (64, 64)):
        fitted = fit_image(image, height, width, fit)
        assert fitted.shape == (height, width, 3) and fitted.dtype == np.uint8
    assert fit_image(image, 48, 64, fit) is image


def test_fit_refusals():
    with pytest.raises(ValueError, match=re.escape("fit must be one of crop, pad, stretch, got 'zoom'")):
        fit_image(noise(4, 4), 2, 2, "zoom")
    with pytest.raises(ValueError, match=re.escape("image must be uint8 [h, w, 3] with h, w >= 1, got float32")):
        fit_image(np.zeros((4, 4, 3), np.float32), 2, 2, "crop")


# canvas_for_image


def test_canvas_from_the_image_aspect_at_the_default_area():
    # 1920 x 1080 (width x height) at 96 x 64 pixels:
    # height sqrt(6144 x 9 / 16) = 58.8 -> 64, width sqrt(6144 x 16 / 9) = 104.5 -> 96
    assert canvas_for_image(1080, 1920, 96 * 64, 512, 512) == (64, 96)
    assert canvas_for_image(1920, 1080, 96 * 64, 512, 512) == (96, 64)  # portrait
    # the reference's area 768 x 1344: 762 x 1355, scaled to the 1024 width maximum -> 576 x 1024
    assert canvas_for_image(1080, 1920, 768 * 1344, 1024, 1024) == (576, 1024)
    assert canvas_for_image(1080, 1920, 768 * 1344, 1000, 1000) == (576, 992)  # maxima rounded down to 32
    assert canvas_for_image(50, 50, 10, 512, 512) == (32, 32)  # at least 32


def test_canvas_with_one_or_both_sides_given():
    assert canvas_for_image(1080, 1920, 6144, 512, 512, height=256) == (256, 448)  # 455.1 -> 448
    assert canvas_for_image(1080, 1920, 6144, 512, 512, width=256) == (160, 256)  # 144 -> 160 (halves up)
    assert canvas_for_image(1080, 1920, 6144, 512, 512, height=512) == (512, 512)  # 910 clamped at max_width
    assert canvas_for_image(1080, 1920, 6144, 512, 512, height=100, width=7) == (100, 7)  # as given


def test_canvas_refusals():
    with pytest.raises(ValueError, match=re.escape("image sides and area must be >= 1, got 0x10, area 6144")):
        canvas_for_image(0, 10, 6144, 512, 512)
    with pytest.raises(ValueError, match=re.escape("max_height, max_width must be >= 32, got 16, 512")):
        canvas_for_image(10, 10, 6144, 16, 512)
