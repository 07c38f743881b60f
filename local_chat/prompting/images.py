"""Images from users, checked before they are decoded: an uploaded file, or a base64 `data:` URL (outside addresses
are never fetched)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image

from local_chat.defaults import MAX_UPLOAD_MB
from local_chat.errors import UserError

MAX_UPLOAD_PIXELS = 40_000_000


def open_upload(path: str | Path | None, max_mb: float = MAX_UPLOAD_MB, max_side: int = 1024) -> Image.Image | None:
    """An uploaded image, checked before it is decoded (file size, then pixel count from the header), as RGB and
    at most `max_side` pixels on its longer side."""
    if not path:
        return None
    path = Path(path)
    return checked_image(path, path.stat().st_size, path.name, max_mb, max_side)


def png_bytes(image: Image.Image) -> bytes:
    """An image as PNG bytes (lossless: what the model sees again is what it saw)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def png_data_url(png: bytes) -> str:
    """PNG bytes as a `data:image/png;base64,...` URL, the inverse of `image_from_data_url`."""
    return "data:image/png;base64," + base64.b64encode(png).decode()


def image_from_data_url(url, max_mb: float = MAX_UPLOAD_MB, max_side: int = 1024) -> Image.Image:
    """An image sent as a `data:image/...;base64,...` URL, with the upload checks. The app never fetches an outside
    address (an http(s) URL) for a client."""
    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:40] if isinstance(url, str) else type(url).__name__
        raise UserError(
            f"An image part holds {shown!r}; send images as data: URLs (data:image/png;base64,...): "
            "this app never fetches outside addresses."
        )
    header, _, payload = url.partition(",")
    if ";base64" not in header or len(payload) * 3 / 4 > max_mb * 1e6:
        size = f"{len(payload) * 3 / 4e6:.1f} MB" if ";base64" in header else "not base64"
        raise UserError(f"An image data: URL is {size}; send a base64 one under {max_mb:g} MB.")
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:
        raise UserError("An image data: URL holds broken base64; encode the image file with base64.")
    return checked_image(io.BytesIO(data), len(data), "The image in a data: URL", max_mb, max_side)


def checked_image(source, size: int, name: str, max_mb: float, max_side: int) -> Image.Image:
    """The image in `source` (a path or a file object of `size` bytes), checked before it is decoded."""
    if size > max_mb * 1e6:
        raise UserError(
            f"The image file is {size / 1e6:.1f} MB; upload one under {max_mb:g} MB (the app's --max_upload_mb)."
        )
    try:
        with Image.open(source) as header:
            width, height = header.size
            if width * height > MAX_UPLOAD_PIXELS:
                raise UserError(
                    f"The image is {width}x{height} pixels; upload one under {MAX_UPLOAD_PIXELS / 1e6:.0f} megapixels."
                )
            image = header.convert("RGB")
    except UserError:
        raise
    except Image.DecompressionBombError:  # Pillow refuses to even read the header of a huge image
        raise UserError(
            f"The image has over {Image.MAX_IMAGE_PIXELS * 2 / 1e6:.0f} million pixels; upload one under "
            f"{MAX_UPLOAD_PIXELS / 1e6:.0f} megapixels."
        )
    except (OSError, ValueError, SyntaxError):  # Pillow raises SyntaxError for a broken file
        raise UserError(
            f"{name} is not an image this app can read (not an image, or a damaged one); upload a "
            "PNG, JPEG, WebP or GIF file."
        )
    if max(image.size) > max_side:
        image.thumbnail((max_side, max_side))
    return image
