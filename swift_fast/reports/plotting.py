"""What every figure the project writes shares: a title that fits the figure (wrapped, never cut
at the edges), a line under it saying how to read the plot, and the same file settings.

A figure is read without its caption (a PNG opened from a run folder, pasted into a chat), so
the title names the run and the subtitle says what a point, a line and a band are."""

from __future__ import annotations

import os
import textwrap

DPI = 120


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    # an average glyph is about 0.55 em wide in matplotlib's default sans-serif
    chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars)) if text else ""


def figure(width: float, height: float):
    """``(fig, ax)`` with constrained layout, which makes room for wrapped titles and an outside legend."""
    return pyplot().subplots(figsize=(width, height), layout="constrained")


def titles(fig, ax, title: str, subtitle: str = "", legend_width: float = 0.0) -> None:
    """``title`` (bold, over the figure) and ``subtitle`` (small, over the axes), each wrapped to the
    figure's width less ``legend_width`` inches (a legend outside the axes)."""
    w = fig.get_figwidth() - legend_width
    fig.suptitle(_wrap(title, w, 11), fontsize=11, fontweight="bold")
    if subtitle:
        ax.set_title(_wrap(subtitle, w, 8.5), fontsize=8.5, color="dimgray")


def save(fig, path: str) -> str:
    """Write ``fig`` to ``path`` (PNG), its folders made, nothing cut at the edges, and close it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    pyplot().close(fig)
    return path
