"""Image-size guard without a server: header parsing of real PIL files and of crafted bombs."""

from __future__ import annotations

import io
import struct

import pytest
from PIL import Image

from tests.reliability import hostile
from tritonpack.components import load_model_module

header = load_model_module("shared", "image_header")
ClientError, check_image_pixels, image_size = header.ClientError, header.check_image_pixels, header.image_size


def encoded(fmt: str, size=(37, 23), **options) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(out, format=fmt, **options)
    return out.getvalue()


@pytest.mark.parametrize("fmt,options", [("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}),
                                         ("JPEG", {"exif": b"Exif\0\0" + bytes(3000)})])
def test_image_size_reads_width_and_height_when_header_is_real(fmt, options):
    assert image_size(encoded(fmt, **options)) == (37, 23)


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "WEBP", "PPM", "JPEG2000"])
def test_image_size_reads_width_and_height_when_the_format_is_another_that_dali_decodes(fmt):
    assert image_size(encoded(fmt)) == (37, 23)


def bmp_claiming(width: int, height: int) -> bytes:
    """A 1x1 BMP whose header claims `width` x `height` (little-endian at bytes 18 and 22 of its info header)."""
    data = bytearray(encoded("BMP", size=(1, 1)))
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def test_check_image_pixels_rejects_image_when_a_bmp_header_claims_more_than_limit():
    # before: only PNG and JPEG were read, and a 1 KB RLE BMP claiming 8000x8000 decoded to 192 MB unchecked
    with pytest.raises(ClientError, match=r"^IMAGE\[0\] header claims 8000x8000 = 64000000 pixels"):
        check_image_pixels(bmp_claiming(8000, 8000), 50_000_000, "IMAGE[0]")


def test_image_size_reads_claimed_size_when_jpeg_header_is_patched():
    assert image_size(hostile.jpeg_claiming(hostile.sample_jpeg(), 20000, 20000)) == (20000, 20000)


def test_image_size_reads_claimed_size_when_png_is_a_bomb():
    assert image_size(hostile.png_bomb(3000, 2000)) == (3000, 2000)


@pytest.mark.parametrize("data", [b"", b"\xff", b"\xff\xd8", b"\xff\xd8\xff", b"not an image", bytes(100),
                                  b"\x89PNG\r\n\x1a\n", hostile.sample_jpeg()[:4]])
def test_image_size_returns_none_when_header_is_unreadable(data):
    assert image_size(data) is None


def test_check_image_pixels_rejects_image_when_header_claims_more_than_limit():
    with pytest.raises(ClientError, match=r"^IMAGE\[0\] header claims 20000x20000"):
        check_image_pixels(hostile.jpeg_claiming(hostile.sample_jpeg(), 20000, 20000), 50_000_000, "IMAGE[0]")


def test_check_image_pixels_accepts_image_when_within_limit_or_disabled():
    assert check_image_pixels(hostile.sample_jpeg(), 64 * 48, "IMAGE[0]") == 64 * 48
    assert check_image_pixels(hostile.jpeg_claiming(hostile.sample_jpeg(), 20000, 20000), 0, "IMAGE[0]") == 4 * 10**8
    assert check_image_pixels(b"not an image", 64 * 48, "IMAGE[0]") == 0


def test_image_size_reads_a_jpeg_through_the_decoders_parser_when_stray_bytes_hide_its_frame_header():
    """A marker byte changed to RST1 (E0 → D1) turned APP0's body into 16 stray bytes: the reading stopped there and
    accepted the image, while libjpeg skips them and decoded a 3.4 KB file claiming 20000x20000 (+2.2 GB)."""
    claiming = hostile.jpeg_claiming(hostile.sample_jpeg(), 20000, 20000)
    stray = claiming[:3] + b"\xd1" + claiming[4:]
    assert header._jpeg_size(stray) is None
    assert image_size(stray) == (20000, 20000)
    with pytest.raises(ClientError, match=r"header claims 20000x20000"):
        check_image_pixels(stray, 50_000_000, "IMAGE[0]")
