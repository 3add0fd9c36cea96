"""Encoded test images of many kinds, made from scikit-image's real photographs (or shipped as they are)."""

from __future__ import annotations

import io
from functools import cache
from importlib.resources import files

import numpy as np
from PIL import Image


def skimage_file(name: str) -> bytes:
    return files("skimage.data").joinpath(name).read_bytes()


def photo(name: str) -> Image.Image:
    return Image.open(io.BytesIO(skimage_file(name)))


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _with_alpha(image: Image.Image) -> Image.Image:
    rgba = image.convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, rgba.width, dtype=np.uint8), (rgba.height, 1))
    rgba.putalpha(Image.fromarray(alpha))
    return rgba


@cache
def image_kinds() -> dict[str, bytes]:
    """kind → encoded bytes; every kind the ensembles must decode to RGB."""
    astronaut, coffee, chelsea = photo("astronaut.png"), photo("coffee.png"), photo("chelsea.png")
    kinds = {
        "jpeg_baseline": encode(astronaut, "JPEG", quality=90),
        "jpeg_progressive": encode(coffee, "JPEG", quality=85, progressive=True),
        "jpeg_real_file": skimage_file("rocket.jpg"),  # a camera JPEG as shipped
        "png_rgb_real_file": skimage_file("chelsea.png"),
        "png_rgba": encode(_with_alpha(chelsea), "PNG"),
        "png_grayscale_real_file": skimage_file("camera.png"),
        "jpeg_grayscale": encode(photo("camera.png"), "JPEG", quality=90),
        "jpeg_cmyk": encode(coffee.convert("CMYK"), "JPEG", quality=90),
        "png_tiny_3x2": encode(astronaut.resize((3, 2), Image.BILINEAR), "PNG"),
        "jpeg_very_tall_24x1400": encode(chelsea.resize((24, 1400), Image.BILINEAR), "JPEG", quality=90),
        "bmp_rgb": encode(coffee.resize((200, 133), Image.BILINEAR), "BMP"),
    }
    assert Image.open(io.BytesIO(kinds["png_rgba"])).mode == "RGBA"
    assert Image.open(io.BytesIO(kinds["png_grayscale_real_file"])).mode == "L"
    assert Image.open(io.BytesIO(kinds["jpeg_cmyk"])).mode == "CMYK"
    assert Image.open(io.BytesIO(kinds["jpeg_progressive"])).info.get("progressive")
    return kinds


@cache
def bad_payloads() -> dict[str, bytes]:
    """kind → bytes that are not a decodable image."""
    jpeg, png = image_kinds()["jpeg_baseline"], image_kinds()["png_rgb_real_file"]
    return {
        "truncated_jpeg": jpeg[: len(jpeg) // 2],
        "truncated_png": png[: len(png) // 2],
        "jpeg_header_only": jpeg[:300],
        "text": b"this is not an image, just some text" * 4,
        "gif_unsupported": encode(photo("chelsea.png").convert("P"), "GIF"),
        "random_bytes": np.random.default_rng(0).integers(1, 256, 2048, dtype=np.uint8).tobytes(),
    }
