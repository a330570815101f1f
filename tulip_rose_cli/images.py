"""Image rows (``--image-column``): a row's value is a file path, the image's
bytes (a Parquet binary column), a data URI or an http(s) URL. Files are
read here, by the worker sending the batch, one at a time just before their
request, so a run holds at most about one request's images per worker; a
value becomes the ``{"image": ...}`` item of ``/v1/embeddings``.

Requests are bounded twice: ``--batch-size`` images at most (as texts),
and ``--image-request-bytes`` of base64 image data at most (default 6 MiB,
about 4.5 MiB of files: under Ivy's default ``--max-body-bytes`` of 8 MiB
with room for the JSON around it). A batch whose images are larger goes in
several requests; one image over the bound is a bad row, never read whole."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

# Base64 image data per request (see the module's docstring).
DEFAULT_REQUEST_BYTES = 6 * 1024 * 1024

# Ivy reads these four (docs/api.md, Images); anything else is sent as
# bare base64 and Ivy says what it is (415: not an image type).
_MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF87a", "image/gif"),
          (b"GIF89a", "image/gif"))


class Unreadable(Exception):
    """The row's image cannot be sent (a missing or unreadable file, an
    empty one, one over the request bound): the row's error."""


def media_type(data: bytes) -> str | None:
    """The image type of ``data`` by its first bytes, or None."""
    for magic, media in _MAGIC:
        if data.startswith(magic):
            return media
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def encoded_size(n: int, media: str = "image/jpeg") -> int:
    """Characters of the data URI of ``n`` bytes (``media`` its type)."""
    return len(f"data:{media};base64,") + 4 * ((n + 2) // 3)


def data_uri(data: bytes) -> str:
    """``data`` as a data URI of its type, or bare base64 when it is none
    Ivy reads (Ivy then answers why)."""
    b64 = base64.b64encode(data).decode("ascii")
    media = media_type(data)
    return f"data:{media};base64,{b64}" if media else b64


def item(image: Path | str | bytes, most: int) -> str:
    """The ``image`` item's value for ``/v1/embeddings``: a file read and
    encoded, bytes encoded, a data URI or URL as given. Raises
    ``Unreadable`` for a file that cannot be read or any value over
    ``most`` characters encoded (``--image-request-bytes``)."""
    if isinstance(image, Path):
        try:
            size = image.stat().st_size
        except FileNotFoundError:
            raise Unreadable(f"no image file {image}") from None
        except OSError as e:
            raise Unreadable(f"cannot read image file {image}: {e.strerror or e}") from None
        if image.is_dir():
            raise Unreadable(f"{image} is a directory, not an image file")
        if size == 0:
            raise Unreadable(f"image file {image} is empty")
        if encoded_size(size) > most:
            raise Unreadable(_over(f"image file {image} is {size:,} bytes", most))
        try:
            data = image.read_bytes()
        except OSError as e:
            raise Unreadable(f"cannot read image file {image}: {e.strerror or e}") from None
        if not data:
            raise Unreadable(f"image file {image} is empty")
        value = data_uri(data)
    elif isinstance(image, bytes):
        if encoded_size(len(image)) > most:
            raise Unreadable(_over(f"the image is {len(image):,} bytes", most))
        value = data_uri(image)
    else:
        value = image
    if len(value) > most:
        raise Unreadable(_over(f"the image is {len(value):,} characters", most))
    return value


def _over(what: str, most: int) -> str:
    return (f"{what}: over {most:,} bytes once base64-encoded (--image-request-bytes; raise it if the "
            f"gateway's --max-body-bytes allows)")


def probe_png() -> bytes:
    """An 8x8 grey PNG: what the run sends before it starts, to find a
    gateway whose model takes no images."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    w = h = 8
    raw = b"".join(b"\0" + b"\x80" * (3 * w) for _ in range(h))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
