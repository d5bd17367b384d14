"""Images a kernel displays, checked and made to fit before the model (and the log) get them.

An image block the Messages API refuses (not base64, not the image its media type says, a side
over 8000 px) fails every later request of the session, since the request carries the whole
conversation; an image of many megabytes makes the tool result too big for the session log.
So every image is decoded from base64 and read by Pillow, every pixel, here: one that is not an
image is dropped, one of another type than it says is re-encoded as that type, one too big (in
bytes, or a side over 8000 px) is downscaled, and one with too many pixels to decode safely in
the server is dropped; each with a note for the model.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # the image types the model takes
FORMATS = MappingProxyType({"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"})
MAX_SIDE = 8000  # the Messages API refuses an image with a longer side
MAX_PIXELS = 25_000_000  # the most the hands decode to downscale (about 100 MB as RGBA)
TRIES = 8  # encodings tried, each smaller, before an image that will not fit is dropped


@dataclass
class Fitted:
    """An image as kept: its base64 data (None: dropped) and a note for the model, if anything was done."""

    data: str | None
    note: str | None = None


def fit(mime: str, data: str, max_bytes: int) -> Fitted:
    """Check a display's image and make it fit `max_bytes` (decoded) and MAX_SIDE; or drop it, saying why."""
    compact = "".join(data.split())  # base64 in a notebook bundle may be wrapped in lines
    try:
        raw = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return Fitted(None, f"[an {mime} display was dropped: its data is not base64]")
    if mime not in IMAGE_TYPES:  # not one the model takes: kept as sent, if small
        if len(raw) <= max_bytes:
            return Fitted(compact)
        return Fitted(None, f"[an {mime} display of {len(raw):,} bytes was dropped: over max_image_bytes ({max_bytes:,})]")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as im:
            fmt, (w, h) = FORMATS.get(im.format or ""), im.size
            if w * h > MAX_PIXELS:
                return Fitted(None, f"[an {mime} display of {w:,}×{h:,} px was dropped: too many pixels to check or "
                                    f"downscale here (over {MAX_PIXELS:,}); save a smaller image and display that]")
            im.load()  # every pixel: an image the model cannot read would fail every later request of the session
            if fmt == mime and len(raw) <= max_bytes and max(w, h) <= MAX_SIDE:
                return Fitted(compact)
            return _shrink(im, mime, fmt, len(raw), max_bytes)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        return Fitted(None, f"[an {mime} display was dropped: its data is not an image the hands can read "
                            f"({type(e).__name__}: {str(e)[:100]})]")


def _shrink(im: object, mime: str, fmt: str | None, size: int, max_bytes: int) -> Fitted:
    from PIL import Image

    assert isinstance(im, Image.Image)
    w, h = im.size
    target = mime  # the type it was displayed as, whatever its data turned out to be
    if im.mode not in ("RGB", "RGBA", "L", "LA"):
        im = im.convert("RGBA" if "transparency" in im.info or im.mode in ("P", "PA") else "RGB")
    if target == "image/jpeg" and im.mode != "RGB":
        im = im.convert("RGB")
    scale = min(1.0, MAX_SIDE / max(w, h), math.sqrt(max_bytes / size) if size > max_bytes else 1.0)
    for _ in range(TRIES):
        nw, nh = max(1, int(w * scale)), max(1, int(h * scale))
        small = im.resize((nw, nh), Image.Resampling.LANCZOS, reducing_gap=3.0) if (nw, nh) != (w, h) else im
        out = io.BytesIO()
        small.save(out, format=target.split("/")[1].upper(), **({"quality": 85} if target == "image/jpeg" else {}))
        if out.tell() <= max_bytes:
            why = (f"max_image_bytes ({max_bytes:,})" if size > max_bytes else
                   f"{MAX_SIDE} px a side, the most the model takes" if max(w, h) > MAX_SIDE else "its type")
            what = "re-encoded" if (nw, nh) == (w, h) else f"downscaled to {nw:,}×{nh:,} px"
            note = (f"[an {mime} display ({w:,}×{h:,} px, {size:,} bytes) was {what} ({out.tell():,} bytes) to fit {why}"
                    + (f"; its data was {fmt or 'of another type'}, now {mime} as it said" if fmt != mime else "") + "]")
            return Fitted(base64.b64encode(out.getvalue()).decode("ascii"), note)
        scale *= min(0.9, math.sqrt(max_bytes / out.tell()) * 0.9)
    return Fitted(None, f"[an {mime} display ({w:,}×{h:,} px, {size:,} bytes) was dropped: no smaller version fit "
                        f"max_image_bytes ({max_bytes:,})]")


SVG_SIDE = 2000  # the longest side of an SVG rendered for the model (it downscales bigger images anyway)


class _TooBig(Exception):
    def __init__(self, width: float, height: float):
        self.width, self.height = width, height


def svg_png(svg: str, max_bytes: int) -> tuple[str | None, str | None]:
    """An SVG rendered as a PNG for the model (which takes no SVG), fitted like any image; (base64, note).

    CairoSVG renders it with no access to files or the network (an SVG may name either), at its own
    size or, if a side is over SVG_SIDE pixels, scaled down to that first (a surface is never made
    bigger); an SVG it cannot render stays text for the model, with a note.
    """
    try:
        from cairosvg.surface import PNGSurface
    except (ImportError, OSError) as e:  # the cairo library itself may be missing
        return None, f"[an image/svg+xml display was not rendered for the model: CairoSVG is unavailable ({e})]"

    class Bounded(PNGSurface):
        def _create_surface(self, width: float, height: float) -> Any:
            if not (0 < width <= SVG_SIDE and 0 < height <= SVG_SIDE):
                raise _TooBig(width, height)
            return super()._create_surface(width, height)

    if len(svg) > 8 * max_bytes:
        return None, f"[an image/svg+xml display of {len(svg):,} characters was too big to render for the model]"
    data, kw = svg.encode("utf-8"), {"unsafe": False, "url_fetcher": _no_fetch, "parent_width": 800, "parent_height": 600}
    try:
        try:
            png = Bounded.convert(bytestring=data, **kw)
        except _TooBig as big:
            if not (big.width > 0 and big.height > 0 and math.isfinite(big.width * big.height)):
                return None, "[an image/svg+xml display without a size could not be rendered for the model]"
            side = "output_width" if big.width >= big.height else "output_height"
            png = Bounded.convert(bytestring=data, **kw, **{side: SVG_SIDE})
    except _TooBig:
        return None, "[an image/svg+xml display could not be rendered for the model: its size is out of bounds]"
    except Exception as e:  # a malformed SVG: the library's own error, whatever its type
        return None, f"[an image/svg+xml display could not be rendered for the model ({type(e).__name__}: {str(e)[:100]})]"
    fitted = fit("image/png", base64.b64encode(png).decode("ascii"), max_bytes)
    return fitted.data, fitted.note


def _no_fetch(url: str, *args: object, **kw: object) -> dict[str, object]:
    raise ValueError(f"an SVG may not load {url[:100]}")
