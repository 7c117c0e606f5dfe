"""Cross-attention heat maps: target tokens (rows) x source tokens (columns), one PNG each.

Drawn with matplotlib's object API on an Agg canvas (no pyplot, no global backend or
figure state), at a size that grows with the sentence so the subword labels stay
readable: `figure_size` gives it, and the PNG is exactly `figure_size(...) * DPI` pixels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

DPI = 100
CELL_INCHES = 0.3  # per token, so labels do not overlap
MARGIN_INCHES = 1.5  # room for tick labels and the colour bar


def figure_size(num_src: int, num_tgt: int, panels: int = 1) -> tuple[float, float]:
    """(width, height) in inches of a picture with `panels` heat maps side by side."""
    width = panels * (num_src * CELL_INCHES + MARGIN_INCHES) + 1.0
    height = num_tgt * CELL_INCHES + MARGIN_INCHES + 0.5
    return max(width, 3.0), max(height, 3.0)


def plot_attention(
    weights: Tensor,
    src_pieces: Sequence[str],
    tgt_pieces: Sequence[str],
    path: Path,
    title: str = "",
    layer_names: Sequence[str] = ("",),
) -> None:
    """Save a heat map of `weights` (tgt_len, src_len) or (tgt_len, layers, src_len).

    `src_pieces`/`tgt_pieces` label the columns/rows (subword pieces, eos included).
    """
    if weights.dim() == 2:
        weights = weights.unsqueeze(1)
    num_tgt, panels, num_src = weights.shape
    # matplotlib only when a picture is drawn: its import is 0.4 s of every translate command's start-up.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its first run's font-cache line is INFO
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=figure_size(num_src, num_tgt, panels), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels, squeeze=False)[0]
    for panel, ax in enumerate(axes):
        image = ax.imshow(weights[:, panel].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(num_src), labels=list(src_pieces), rotation=90, fontsize=8)
        ax.set_yticks(range(num_tgt), labels=list(tgt_pieces), fontsize=8)
        ax.set_xlabel("source")
        if panel == 0:
            ax.set_ylabel("target")
        if panel < len(layer_names) and layer_names[panel]:
            ax.set_title(layer_names[panel], fontsize=9)
    figure.colorbar(image, ax=list(axes), fraction=0.05)
    if title:
        figure.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
