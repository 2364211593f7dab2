"""Cross-attention heatmaps: source pieces on x, target pieces on y.

Uses matplotlib's object API with the Agg canvas (no pyplot, no display, no global state), so it
works on headless machines and inside a training loop.

Legend: L layers, H heads, T target pieces, S source pieces.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

_INCHES_PER_PIECE = 0.28
_MAX_INCHES = 30.0  # long sentences: labels get crowded, but the figure stays a sane size


def select_attention(weights: Tensor, layer: int = -1, heads: bool = False) -> Tensor:
    """Reduce attention weights to what gets drawn.

    Args:
        weights: (L, H, T, S) every layer, (H, T, S) one layer, or (T, S) one map.
        layer: which layer of a 4-d input (default: the last).
        heads: keep the heads (H, T, S) for a grid; otherwise average them to (T, S).
    """
    weights = weights.detach().float().cpu()
    if weights.dim() == 4:
        weights = weights[layer]  # (H, T, S)
    if weights.dim() == 3 and not heads:
        weights = weights.mean(dim=0)  # (T, S)
    if weights.dim() not in (2, 3):
        raise ValueError(
            f"expected (L, H, T, S), (H, T, S) or (T, S) weights, got {tuple(weights.shape)}"
        )
    return weights


def attention_figure(
    src_pieces: list[str],
    tgt_pieces: list[str],
    weights: Tensor,
    title: str | None = None,
    layer: int = -1,
    heads: bool = False,
) -> Figure:
    """A matplotlib Figure of the heatmap (or of a grid of heads with `heads=True`).

    Shape:
        weights: (L, H, T, S), (H, T, S) or (T, S), with T = len(tgt_pieces) and
        S = len(src_pieces).
    """
    maps = select_attention(weights, layer, heads)
    maps = maps.unsqueeze(0) if maps.dim() == 2 else maps  # (n, T, S)
    n_maps, T, S = maps.shape
    if (T, S) != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(
            f"weights are {T}x{S} but there are {len(tgt_pieces)}x{len(src_pieces)} pieces"
        )
    n_cols = min(4, n_maps)
    n_rows = math.ceil(n_maps / n_cols)
    width = min(_MAX_INCHES, n_cols * (S * _INCHES_PER_PIECE + 1.5))
    height = min(_MAX_INCHES, n_rows * (T * _INCHES_PER_PIECE + 1.5))
    fig = Figure(figsize=(max(width, 3.0), max(height, 2.5)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, grid_ax in enumerate(fig.subplots(n_rows, n_cols, squeeze=False).flat):
        if i >= n_maps:
            grid_ax.axis("off")
            continue
        _draw_heatmap(grid_ax, maps[i].numpy(), src_pieces, tgt_pieces)
        if n_maps > 1:
            grid_ax.set_title(f"head {i}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _draw_heatmap(
    ax: Axes, weights: np.ndarray, src_pieces: list[str], tgt_pieces: list[str]
) -> None:
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(src_pieces)), src_pieces, rotation=90, fontsize=7)
    ax.set_yticks(range(len(tgt_pieces)), tgt_pieces, fontsize=7)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.figure.colorbar(image, ax=ax, shrink=0.8)


def plot_attention(
    src_pieces: list[str],
    tgt_pieces: list[str],
    weights: Tensor,
    path: str | Path,
    title: str | None = None,
    layer: int = -1,
    heads: bool = False,
) -> Path:
    """Save the heatmap as an image file (PNG by the suffix); returns the path.

    By default the heads of the last layer are averaged; `heads=True` draws each head.
    """
    path = Path(path)
    attention_figure(src_pieces, tgt_pieces, weights, title, layer, heads).savefig(path, dpi=100)
    return path


def heatmap_image(
    src_pieces: list[str],
    tgt_pieces: list[str],
    weights: Tensor,
    title: str | None = None,
    layer: int = -1,
    heads: bool = False,
) -> np.ndarray:
    """The heatmap as an RGB uint8 array of shape (height, width, 3).

    For TensorBoard: `writer.add_image(tag, image, step, dataformats="HWC")`.
    """
    fig = attention_figure(src_pieces, tgt_pieces, weights, title, layer, heads)
    canvas = fig.canvas
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)


def heatmap_tensor(
    src_pieces: list[str],
    tgt_pieces: list[str],
    weights: Tensor,
    title: str | None = None,
    layer: int = -1,
    heads: bool = False,
) -> Tensor:
    """The heatmap as a float CHW tensor in [0, 1] (`add_image`'s default layout)."""
    image = heatmap_image(src_pieces, tgt_pieces, weights, title, layer, heads)
    return torch.from_numpy(image).permute(2, 0, 1).float() / 255.0  # (3, H, W)
