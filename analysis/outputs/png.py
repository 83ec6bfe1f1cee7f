"""Compact PNGs: a figure as a 256-colour palette image (what :func:`style.save` writes).

Matplotlib writes 8-bit RGBA; a report figure is a few flat colours, their anti-aliased
edges and text, so a palette of 256 holds it: about a third of the bytes. A figure of at
most 256 colours keeps every pixel; one of more keeps 128 colours exactly, the drawn ones
(those with solid 2x2 blocks: fills, legend swatches, thick lines; then the most frequent),
and maps the others (anti-aliased edge blends) to the nearest of 128 more, spread over those
colours' own range. On the published figures: every pixel of a solid block exact, an edge
pixel at most 42 levels off. Text chunks (the Description that
marks a placeholder, :func:`style.has_data`) and the resolution stay. Deterministic (the
same figure gives the same bytes) and idempotent (a compacted PNG compacts to itself).

    python -m analysis.outputs.png FILE.png ...   # compact PNGs that cannot be redrawn
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image, PngImagePlugin

COLORS = 256
EXACT = 128  # colours kept as they are (the drawn ones) when a figure has more than COLORS


def compact(data: bytes) -> bytes:
    """``data`` (a PNG) as a palette PNG; ``data`` itself where that is not smaller or the
    image has transparency (a palette of opaque colours would drop it)."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        if image.mode not in ("RGB", "RGBA") or _transparent(image):
            return data
        out = to_palette(np.asarray(image.convert("RGB")))
        buffer = io.BytesIO()
        out.save(buffer, "PNG", optimize=True, pnginfo=_text(image), **_dpi(image))
    return min(buffer.getvalue(), data, key=len)


def compact_file(path: Path) -> int:
    """Compact ``path`` in place; the bytes saved."""
    data = path.read_bytes()
    small = compact(data)
    if len(small) < len(data):
        path.write_bytes(small)
    return len(data) - len(small)


def to_palette(pixels: np.ndarray) -> Image.Image:
    """An (h, w, 3) uint8 image as a "P" image: each pixel its colour's nearest palette
    entry (exact nearest: Pillow's own mapping goes through a 5-6-5 bit cache, which moves
    colours a few levels apart onto one entry)."""
    packed = (pixels[..., 0].astype(np.int64) << 16) | (pixels[..., 1].astype(np.int64) << 8) \
        | pixels[..., 2]
    colors, inverse, counts = np.unique(packed.ravel(), return_inverse=True,
                                        return_counts=True)
    rgb = np.stack([colors >> 16, (colors >> 8) & 255, colors & 255], axis=1)
    entries = palette(rgb, counts, _solid_counts(packed, colors))
    nearest = _nearest(rgb, entries)
    image = Image.fromarray(nearest[inverse].reshape(pixels.shape[:2]).astype(np.uint8), "P")
    image.putpalette(entries.astype(np.uint8).ravel().tolist())
    return image


def _solid_counts(packed: np.ndarray, colors: np.ndarray) -> np.ndarray:
    """Per colour (``colors``, sorted), how many 2x2 blocks of it the image has: a drawn
    colour (a fill, a legend swatch, a thick line) has some, an anti-aliased edge blend
    next to none."""
    corner = packed[:-1, :-1]
    solid = (corner == packed[1:, :-1]) & (corner == packed[:-1, 1:]) & (corner == packed[1:, 1:])
    found, n = np.unique(corner[solid], return_counts=True)
    out = np.zeros(len(colors), dtype=np.int64)
    out[np.searchsorted(colors, found)] = n
    return out


def palette(rgb: np.ndarray, counts: np.ndarray, solid: np.ndarray) -> np.ndarray:
    """The palette (n, 3) for an image's distinct colours ``rgb`` (n, 3), their pixel
    ``counts`` and their ``solid`` block counts: all of them when they fit; else the EXACT
    drawn ones (most solid blocks first, then most pixels) and an octree palette over the
    rest (each rare colour counted once: a small marker's colour weighs as much as a common
    edge blend)."""
    # ties by colour: the palette (and so the bytes) do not depend on order
    ranked = rgb[np.lexsort((rgb[:, 2], rgb[:, 1], rgb[:, 0], -counts, -solid))]
    if len(ranked) <= COLORS:
        return ranked
    return np.concatenate([ranked[:EXACT], _spread(ranked[EXACT:], COLORS - EXACT)])


def _spread(colors: np.ndarray, n: int) -> np.ndarray:
    """``n`` colours covering ``colors`` (Pillow's octree over one pixel per colour)."""
    strip = Image.fromarray(colors.astype(np.uint8)[np.newaxis], "RGB")
    quantized = strip.quantize(n, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    flat = np.array(quantized.getpalette() or [], dtype=np.int64).reshape(-1, 3)
    return flat[np.unique(np.asarray(quantized))]


def _nearest(rgb: np.ndarray, entries: np.ndarray) -> np.ndarray:
    """Per colour, the index of its nearest entry (squared distance; the first on a tie,
    so a colour in the palette maps to itself)."""
    out = np.empty(len(rgb), dtype=np.int64)
    for lo in range(0, len(rgb), 4096):  # bounded memory: 4096 x 256 distances at a time
        diff = rgb[lo:lo + 4096, np.newaxis, :] - entries[np.newaxis, :, :]
        out[lo:lo + 4096] = np.argmin((diff * diff).sum(axis=2), axis=1)
    return out


def _transparent(image: Image.Image) -> bool:
    if image.mode != "RGBA":
        return False
    low, _ = image.getchannel("A").getextrema()
    return low < 255


def _text(image: Image.Image) -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    for key, value in getattr(image, "text", {}).items():
        info.add_text(key, value)
    return info


def _dpi(image: Image.Image) -> dict[str, tuple[float, float]]:
    dpi = image.info.get("dpi")
    return {"dpi": dpi} if dpi else {}


def main(argv: list[str]) -> int:
    saved = sum(compact_file(Path(p)) for p in argv)
    print(f"{len(argv)} PNGs, {saved / 1e6:.2f} MB saved")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
