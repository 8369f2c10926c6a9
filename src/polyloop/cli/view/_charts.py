"""Charts as inline SVG (no chart library): horizontal bars, histograms, and the bins."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from ._html import esc


def hbars(items: Sequence[tuple[str, int, str]], *, label: str) -> str:
    """One bar per ``(name, count, css class)``, with its count and share."""
    if not items:
        return '<p class="empty">No data.</p>'
    total = sum(n for _, n, _ in items) or 1
    top = max(n for _, n, _ in items) or 1
    row_h, label_w, bar_w, width = 26, 200, 360, 660
    height = row_h * len(items) + 8
    parts = [
        f'<svg class="chart hbars" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(label)}"><title>{esc(label)}</title>'
    ]
    for i, (name, n, cls) in enumerate(items):
        y = 4 + i * row_h
        w = max(bar_w * n / top, 1.5)
        share = 100 * n / total
        parts.append(
            f'<g class="bar {esc(cls)}" data-label="{esc(name)}" data-count="{n}">'
            f"<title>{esc(name)}: {n} ({share:.1f}%)</title>"
            f'<text x="{label_w - 8}" y="{y + 17}" text-anchor="end">{esc(name)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" rx="3"></rect>'
            f'<text class="value" x="{label_w + w + 6:.1f}" y="{y + 17}">{n} '
            f"({share:.0f}%)</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def histogram(bins: Sequence[tuple[str, int]], *, label: str, x_label: str) -> str:
    """Vertical bars over labelled bins, counts on top."""
    if not bins or not any(n for _, n in bins):
        return '<p class="empty">No data.</p>'
    top = max(n for _, n in bins) or 1
    width, height, left, bottom, plot_h = 660, 250, 40, 56, 170
    step = (width - left - 10) / len(bins)
    bar = min(max(step * 0.8, 1.0), 64.0)
    parts = [
        f'<svg class="chart histogram" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(label)}"><title>{esc(label)}</title>',
        f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width - 10}" '
        f'y2="{height - bottom}"></line>',
    ]
    every = max(1, math.ceil(len(bins) / 12))
    for i, (name, n) in enumerate(bins):
        h = plot_h * n / top
        x = left + i * step + (step - bar) / 2
        y = height - bottom - h
        parts.append(
            f'<g class="bin" data-label="{esc(name)}" data-count="{n}">'
            f"<title>{esc(name)}: {n}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{max(h, 0):.1f}" '
            f'rx="2"></rect>'
        )
        if n:
            parts.append(
                f'<text class="value" x="{x + bar / 2:.1f}" y="{y - 4:.1f}" '
                f'text-anchor="middle">{n}</text>'
            )
        if i % every == 0:
            parts.append(
                f'<text class="tick" x="{x + bar / 2:.1f}" y="{height - bottom + 16}" '
                f'text-anchor="middle">{esc(name)}</text>'
            )
        parts.append("</g>")
    parts.append(
        f'<text class="axis-label" x="{(width + left) / 2}" y="{height - 12}" '
        f'text-anchor="middle">{esc(x_label)}</text></svg>'
    )
    return "".join(parts)


def int_bins(values: Sequence[int], max_bins: int = 20) -> list[tuple[str, int]]:
    """Equal-width integer bins over ``values`` (one per value when few)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    width = max(1, math.ceil((hi - lo + 1) / max_bins))
    count = (hi - lo) // width + 1
    out = [0] * count
    for v in values:
        out[(v - lo) // width] += 1
    labels = [
        str(lo + i * width) if width == 1 else f"{lo + i * width}–{lo + (i + 1) * width - 1}"
        for i in range(count)
    ]
    return list(zip(labels, out, strict=True))


_MS_EDGES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 60000, 120000)


def _ms_label(v: float) -> str:
    return f"{v / 1000:g}s" if v >= 1000 else f"{v:g}ms"


def ms_bins(values: Sequence[float]) -> list[tuple[str, int]]:
    """Log-spaced time bins (1-2-5 steps), trimmed to the range that has values."""
    if not values:
        return []
    edges = list(_MS_EDGES)
    counts = [0] * (len(edges) + 1)
    for v in values:
        i = 0
        while i < len(edges) and v >= edges[i]:
            i += 1
        counts[i] += 1
    labels = [f"<{_ms_label(edges[0])}"]
    labels += [f"{_ms_label(a)}–{_ms_label(b)}" for a, b in itertools.pairwise(edges)]
    labels.append(f"≥{_ms_label(edges[-1])}")
    first = next(i for i, n in enumerate(counts) if n)
    last = max(i for i, n in enumerate(counts) if n)
    return list(zip(labels[first : last + 1], counts[first : last + 1], strict=True))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values (0 when empty)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return float(sorted_values[k])
