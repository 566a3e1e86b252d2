"""Figures of attention: under a spectrogram on a time axis, over an image per token, and
self-attention matrices. Headless: plain :class:`matplotlib.figure.Figure` objects rendered by
the Agg canvas, never pyplot, so no display or backend switch is needed.

Shapes: f mel bins, t frames, n caption tokens, m memory positions, gh gw patch grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.image
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mmtf.decoders.align import WordSpan

CMAP = "magma"
LABEL_SIZE, TICK_SIZE, TITLE_SIZE = 11, 9, 12
# Readable rows: at most this many token labels on one axis before thinning them.
MAX_TOKEN_LABELS = 48


def render_rgb(fig: Figure) -> np.ndarray:
    """The figure as an (H, W, 3) uint8 image (for TensorBoard's ``add_image``)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write the figure as PNG (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi)
    return path


def render_and_save(fig: Figure, path: str | Path, dpi: int = 110) -> np.ndarray:
    """Draw the figure once at ``dpi``: its (H, W, 3) uint8 image, also written to ``path`` as
    PNG (parents created). What the training callback logs and writes each validation: one
    draw (the constrained layout is most of it, ~0.5 s on a CPU core), not one per output."""
    fig.set_dpi(dpi)
    image = render_rgb(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib.image.imsave(path, image, format="png")
    return image


def _wrap(text: str, width: int = 110) -> str:
    """Each line of ``text`` wrapped at ``width`` characters (line breaks kept)."""
    import textwrap

    return "\n".join(part for line in text.splitlines()
                     for part in (textwrap.wrap(line, width) or [""]))


def _token_axis(ax, labels: Sequence[str], axis: str = "y") -> None:
    """Label each row (or column) with its token, thinned to at most MAX_TOKEN_LABELS."""
    step = max(1, int(np.ceil(len(labels) / MAX_TOKEN_LABELS)))
    ticks = np.arange(0, len(labels), step)
    names = [labels[i] for i in ticks]
    if axis == "y":
        ax.set_yticks(ticks, names, fontsize=TICK_SIZE)
    else:
        ax.set_xticks(ticks, names, fontsize=TICK_SIZE, rotation=90)


def _spectrogram(ax, spec: np.ndarray, frame_seconds: float, duration: float):
    """Draw log-mel features (f, t) on a seconds axis; frame j is centred at j * frame_seconds."""
    t = spec.shape[1]
    im = ax.imshow(spec, origin="lower", aspect="auto", cmap="viridis", interpolation="nearest",
                   extent=(-0.5 * frame_seconds, (t - 0.5) * frame_seconds, 0, spec.shape[0]))
    ax.set_xlim(0, duration)
    ax.set_ylabel("mel bin", fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    return im


def _time_map(ax, matrix: np.ndarray, position_seconds: float, labels: Sequence[str]):
    """Draw an (n, m) token-by-position map with positions centred at k * position_seconds.

    The colour range is the map's own (the colour bar gives the values): near-uniform
    attention of an early model would otherwise be one flat colour."""
    n, m = matrix.shape
    im = ax.imshow(matrix, aspect="auto", cmap=CMAP, interpolation="nearest",
                   extent=(-0.5 * position_seconds, (m - 0.5) * position_seconds, n - 0.5, -0.5))
    _token_axis(ax, labels)
    ax.tick_params(axis="x", labelsize=TICK_SIZE)
    return im


def _word_strip(ax, spans: Sequence[WordSpan]) -> None:
    """Each word as a bar over its span, on two alternating levels so neighbours never overlap."""
    colors = ("#4e79a7", "#f28e2b")
    for i, span in enumerate(spans):
        level = i % 2
        ax.barh(level, max(span.end - span.start, 1e-3), left=span.start, height=0.8,
                color=colors[level], alpha=0.35, edgecolor=colors[level], linewidth=1.0)
        ax.text((span.start + span.end) / 2, level, span.word, ha="center", va="center",
                fontsize=TICK_SIZE, clip_on=True)
    ax.set_ylim(1.6, -0.6)
    ax.set_yticks([])
    ax.set_ylabel("words", fontsize=LABEL_SIZE, rotation=0, ha="right", va="center")
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)


def _mark_starts(ax, spans: Sequence[WordSpan]) -> None:
    """Thin dashed lines on the spectrogram where each word starts."""
    for span in spans:
        ax.axvline(span.start, color="white", lw=0.8, ls="--", alpha=0.7)


def audio_attention_figure(spec: np.ndarray, *, frame_seconds: float, duration: float,
                           maps: dict[str, np.ndarray], position_seconds: float,
                           labels: Sequence[str], caption: str,
                           spans: Sequence[WordSpan] | None = None) -> Figure:
    """Log-mel spectrogram on top, the aligned words (if any), then one cross-attention map per
    entry of ``maps``, all on one time axis in seconds.

    Args:
        spec: (f, t) log-mel features of the valid frames.
        frame_seconds, position_seconds, duration: seconds between frames, between memory
            positions, and of the clip (the x range).
        maps: panel title -> (n, m) attention of each caption token over the memory positions.
        labels, caption: n token labels (the rows), the generated caption (the title).
        spans: aligned words to show under the spectrogram, or None.
    """
    n = len(labels)
    map_height = max(1.8, 0.24 * n + 0.6)
    heights = [2.4, *([0.7] if spans else []), *([map_height] * len(maps))]
    fig = Figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    im = _spectrogram(axes[0], spec, frame_seconds, duration)
    fig.colorbar(im, ax=axes[0], pad=0.01, fraction=0.025).set_label("log-mel (norm.)",
                                                                      fontsize=TICK_SIZE)
    map_axes = axes[1:]
    if spans:
        _mark_starts(axes[0], spans)
        _word_strip(axes[1], spans)
        map_axes = axes[2:]
    for ax, (title, matrix) in zip(map_axes, maps.items()):
        im = _time_map(ax, matrix, position_seconds, labels)
        ax.set_title(title, fontsize=LABEL_SIZE, loc="left")
        ax.set_ylabel("generated token", fontsize=LABEL_SIZE)
        fig.colorbar(im, ax=ax, pad=0.01, fraction=0.025).set_label("attention",
                                                                     fontsize=TICK_SIZE)
    axes[-1].set_xlabel("time (s)", fontsize=LABEL_SIZE)
    fig.suptitle(_wrap(f"caption: {caption}"), fontsize=TITLE_SIZE)
    return fig


def alignment_figure(spec: np.ndarray, *, frame_seconds: float, duration: float,
                     matrix: np.ndarray, path: tuple[np.ndarray, np.ndarray],
                     position_seconds: float, labels: Sequence[str], spans: Sequence[WordSpan],
                     caption: str) -> Figure:
    """Word spans over the spectrogram, above the DTW path through the alignment matrix.

    Args:
        spec: (f, t) log-mel features of the valid frames.
        frame_seconds, duration, position_seconds: as in :func:`audio_attention_figure`.
        matrix: (n, m) alignment matrix (normalised, filtered attention) of the caption tokens.
        path: (rows, cols) of the DTW path through ``matrix``.
        labels, spans, caption: token labels, aligned words, the generated caption.
    """
    n = len(labels)
    heights = [2.6, 0.7, max(1.8, 0.24 * n + 0.6)]
    fig = Figure(figsize=(12, sum(heights) + 0.9), layout="constrained")
    top, strip, bottom = fig.subplots(3, 1, sharex=True, height_ratios=heights)
    im = _spectrogram(top, spec, frame_seconds, duration)
    fig.colorbar(im, ax=top, pad=0.01, fraction=0.025).set_label("log-mel (norm.)",
                                                                  fontsize=TICK_SIZE)
    _mark_starts(top, spans)
    _word_strip(strip, spans)
    top.set_title("words aligned to time (DTW over cross-attention)", fontsize=LABEL_SIZE,
                  loc="left")
    m = matrix.shape[1]
    im = bottom.imshow(matrix, aspect="auto", cmap="RdBu_r", interpolation="nearest",
                       vmin=-np.abs(matrix).max(), vmax=np.abs(matrix).max(),
                       extent=(-0.5 * position_seconds, (m - 0.5) * position_seconds,
                               n - 0.5, -0.5))
    rows, cols = path
    bottom.plot(cols * position_seconds, rows, color="black", lw=1.6)
    _token_axis(bottom, labels)
    bottom.tick_params(axis="x", labelsize=TICK_SIZE)
    bottom.set_ylabel("generated token", fontsize=LABEL_SIZE)
    bottom.set_xlabel("time (s)", fontsize=LABEL_SIZE)
    bottom.set_title("alignment matrix: attention z-scored over tokens, median-filtered; "
                     "black: the DTW path",
                     fontsize=LABEL_SIZE, loc="left")
    fig.colorbar(im, ax=bottom, pad=0.01, fraction=0.025).set_label("z-score", fontsize=TICK_SIZE)
    fig.suptitle(_wrap(f"caption: {caption}"), fontsize=TITLE_SIZE)
    return fig


def image_attention_figure(image: np.ndarray, *, maps: np.ndarray, grid: tuple[int, int],
                           labels: Sequence[str], caption: str, title: str,
                           prefix_weight: np.ndarray | None = None, columns: int = 6) -> Figure:
    """The image, then one panel per caption token with its cross-attention over the patches
    as a heatmap on the image; one colour scale for all tokens.

    Args:
        image: (H, W, 3) float in [0, 1].
        maps, grid: (n, gh * gw) attention of each token over the (gh, gw) patch grid (row-major).
        labels, caption: as :func:`audio_attention_figure`.
        title: what the maps are (layer, heads).
        prefix_weight: (n,) attention each token gave the CLS token (not on the grid), or None.
        columns: most panels per row (rows are balanced).
    """
    n = len(labels)
    gh, gw = grid
    rows = int(np.ceil((n + 1) / columns))
    columns = int(np.ceil((n + 1) / rows))          # balanced rows: no lone panel at the end
    fig = Figure(figsize=(2.1 * columns, 2.25 * rows + 0.9), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    h, w = image.shape[:2]
    extent = (0, w, h, 0)
    # One colour scale for every token, over the range the patches actually get.
    vmin, vmax = (float(maps.min()), float(maps.max())) if maps.size else (0.0, 1.0)
    axes[0].imshow(image, extent=extent)
    axes[0].set_title("input", fontsize=LABEL_SIZE)
    im = None
    for i in range(n):
        ax = axes[i + 1]
        ax.imshow(image, extent=extent)
        im = ax.imshow(maps[i].reshape(gh, gw), cmap=CMAP, alpha=0.6, vmin=vmin, vmax=vmax,
                       extent=extent, interpolation="bilinear")
        name = f"{i}: {labels[i]}"
        if prefix_weight is not None:
            name += f"  (CLS {prefix_weight[i]:.2f})"
        ax.set_title(name, fontsize=TICK_SIZE)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[n + 1:]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=list(axes[: n + 1]), pad=0.01, fraction=0.02, shrink=0.8
                     ).set_label("attention", fontsize=TICK_SIZE)
    fig.suptitle(_wrap(f"{title}\ncaption: {caption}", 90), fontsize=TITLE_SIZE)
    return fig


def self_attention_figure(matrix: np.ndarray, *, title: str, labels: Sequence[str] | None = None,
                          position_seconds: float | None = None, axis_name: str = "position",
                          ) -> Figure:
    """One self-attention matrix (queries x keys) with labelled axes and a colour bar.

    Args:
        matrix: (k, k) attention, rows = queries.
        title: what it is (encoder/decoder, layer, head).
        labels, position_seconds: token labels (decoder) or seconds between positions
            (audio encoder) for the axes, or None; else ``axis_name`` (e.g. "patch").
        axis_name: the axis label otherwise.
    """
    k = matrix.shape[0]
    side = 7.5 if labels is None else max(6.0, 0.24 * k + 2.5)
    fig = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = fig.subplots()
    extent = None
    if position_seconds is not None:
        e = (k - 0.5) * position_seconds
        extent = (-0.5 * position_seconds, e, e, -0.5 * position_seconds)
    im = ax.imshow(matrix, cmap=CMAP, interpolation="nearest", extent=extent)
    if labels is not None:
        _token_axis(ax, labels, "y")
        _token_axis(ax, labels, "x")
        ax.set_xlabel("key (input token)", fontsize=LABEL_SIZE)
        ax.set_ylabel("query (input token)", fontsize=LABEL_SIZE)
    elif position_seconds is not None:
        ax.set_xlabel("key time (s)", fontsize=LABEL_SIZE)
        ax.set_ylabel("query time (s)", fontsize=LABEL_SIZE)
    else:
        ax.set_xlabel(f"key {axis_name}", fontsize=LABEL_SIZE)
        ax.set_ylabel(f"query {axis_name}", fontsize=LABEL_SIZE)
    ax.tick_params(labelsize=TICK_SIZE)
    fig.colorbar(im, ax=ax, pad=0.01, fraction=0.04).set_label("attention", fontsize=TICK_SIZE)
    ax.set_title(title, fontsize=TITLE_SIZE)
    return fig
