"""Image dimensions from the image's header, read before any decoding (decompression-bomb guard).

PNG and JPEG, nearly all traffic, are read here with the standard library; the other formats DALI decodes (BMP,
TIFF, WebP, PNM, JPEG 2000), and a PNG or JPEG this reading cannot follow, by nvImageCodec's parsers, the library
DALI decodes them with. Copied beside each python model's `model.py` at build time.
"""

from __future__ import annotations

import struct

from batched_requests import ClientError

try:
    from nvidia import nvimgcodec
except ImportError:
    nvimgcodec = None

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# SOFn markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not frames.
JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) claimed by the image's header; None when no decoder could read it. A PNG or JPEG header
    this reading does not follow (a decoder skips stray bytes between JPEG markers) goes to nvImageCodec's parser."""
    if data[:8] == PNG_SIGNATURE and len(data) >= 24 and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8" and (size := _jpeg_size(data)) is not None:
        return size
    return _other_format_size(data)


def _other_format_size(data: bytes) -> tuple[int, int] | None:
    if nvimgcodec is None:  # no DALI beside this model: nothing decodes the image either
        return None
    try:
        stream = nvimgcodec.CodeStream(data)
        return stream.width, stream.height
    except RuntimeError:  # no parser recognised it: DALI refuses it as undecodable
        return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in JPEG_FRAME_MARKERS:
            if i + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            return width, height
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    return None


def check_image_pixels(data: bytes, max_pixels: int, name: str) -> int:
    """The pixels the header claims (0 when no parser reads it: nothing decodes it either); ClientError when more
    than `max_pixels` (0 disables the check)."""
    size = image_size(data)
    pixels = size[0] * size[1] if size is not None else 0
    if 0 < max_pixels < pixels:
        raise ClientError(f"{name} header claims {size[0]}x{size[1]} = {pixels} pixels, more than the limit of "
                          f"{max_pixels}")
    return pixels
