"""Figures are written as 256-colour palette PNGs (analysis/outputs/png.py via style.save):
checked against matplotlib's own RGBA render of the same figure, pixel by pixel."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from analysis.outputs import png, style
from analysis.outputs.figures import write_figures

# How far an anti-aliased edge pixel may move in a figure of more than 256 colours (mapped
# to a neighbouring blend); the published figures stay at 42.
MAX_LEVELS = 48


def _bars(points: int = 40) -> Figure:
    """A report-like figure: bars in the palette's colours, a line, labels, a legend."""
    fig, axes = style.figure(height=3.0)
    ax = axes[0][0]
    x = np.arange(points)
    bars = ax.bar(x, np.sqrt(x + 1), color=[style.PALETTE[i % 10] for i in x])
    ax.plot(x, np.sqrt(x + 1) * 0.8, color="#333333")
    style.bar_labels(ax, bars, [f"{v:.1f}" for v in np.sqrt(x + 1)], horizontal=False,
                     fontsize=5)
    ax.set_title("bars")
    return fig


def _rgba(fig: Figure, **kwargs: object) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=style.DPI, **kwargs)
    return buffer.getvalue()


def _pixels(data: bytes | Path) -> np.ndarray:
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    with Image.open(source) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def test_save_writes_the_figure_as_a_palette_png(tmp_path: Path) -> None:
    reference = _rgba(_bars())
    path = style.save(_bars(), tmp_path / "bars.png", description="bars for a test")
    with Image.open(path) as image:
        assert image.mode == "P" and image.info["Description"] == "bars for a test"
        assert [round(d) for d in image.info["dpi"]] == [style.DPI, style.DPI]
    assert path.stat().st_size < len(reference) / 2
    before, after = _pixels(reference), _pixels(path)
    assert before.shape == after.shape
    off = np.abs(before - after).max(axis=2)
    assert off.max() <= MAX_LEVELS and (off > 8).mean() < 0.01
    # more colours than a palette holds (anti-aliasing), yet every drawn colour is exact:
    # each pixel of a solid 2x2 block (fills, legend swatches, the background)
    assert len(np.unique(before.reshape(-1, 3), axis=0)) > png.COLORS
    corner = before[:-1, :-1]
    solid = ((corner == before[1:, :-1]) & (corner == before[:-1, 1:])
             & (corner == before[1:, 1:])).all(axis=2)
    assert (after[:-1, :-1][solid] == corner[solid]).all()


def test_a_figure_of_few_colours_keeps_every_pixel() -> None:
    # neighbouring colours one level apart (Pillow's own palette mapping merges those)
    rng = np.random.default_rng(0)
    levels = np.array([[i, 100 + i % 3, 255 - i] for i in range(256)], dtype=np.uint8)
    pixels = levels[rng.integers(0, 256, size=(64, 96))]
    image = png.to_palette(pixels)
    assert image.mode == "P"
    assert (np.asarray(image.convert("RGB")) == pixels).all()


def test_compacting_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    first = png.compact(_rgba(_bars(200)))
    assert png.compact(_rgba(_bars(200))) == first
    assert png.compact(first) == first
    path = tmp_path / "f.png"
    path.write_bytes(first)
    assert png.compact_file(path) == 0 and path.read_bytes() == first


def test_a_transparent_png_is_left_as_it_is() -> None:
    data = _rgba(_bars(), transparent=True)
    assert png.compact(data) == data


def test_placeholders_stay_placeholders(tmp_path: Path) -> None:
    paths = write_figures(tmp_path / "summary.csv", tmp_path, tmp_path / "plots")
    assert paths and not any(style.has_data(p) for p in paths)
    with Image.open(paths[0]) as image:
        assert image.mode == "P"
