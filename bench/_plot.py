"""A line plot as a small hand-written SVG (no plotting library in the environment)."""

from __future__ import annotations

import math


def svg_plot(lines: dict[str, list[tuple[float, float]]], c: int, title: str) -> str:
    """Step lines of each series over time; a dashed line at C; ticks at 0, C/2, C, and every
    10 s (a multiple of 10 s past 150 s, so that a long run keeps about 15 labels)."""
    width, height, pad = 720, 300, 44
    t_max = max(t for pts in lines.values() for t, _ in pts)
    colours = {"sync": "#d62728", "async": "#1f77b4", "async-reuse": "#2ca02c"}

    def x(t: float) -> float:
        return pad + (width - 2 * pad) * t / t_max

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * v / (1.1 * c)

    def line(points: list[tuple[float, float]], style: str) -> str:
        xy = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        return f'<polyline points="{xy}" fill="none" {style}/>'

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{pad}" y="18">{title}</text>',
        line([(0, 1.1 * c), (0, 0), (t_max, 0)], 'stroke="black"'),
        line([(0, c), (t_max, c)], 'stroke="grey" stroke-dasharray="4"'),
        f'<text x="{width / 2 - 20}" y="{height - 8}">seconds</text>',
    ]
    for level in (0, c // 2, c):
        parts.append(f'<text x="{pad - 6}" y="{y(level) + 4:.1f}" text-anchor="end">{level}</text>')
    for tick in range(0, int(t_max) + 1, 10 * max(1, math.ceil(t_max / 150))):
        parts.append(
            f'<text x="{x(tick):.1f}" y="{height - pad + 16}" text-anchor="middle">{tick}</text>'
        )
    for i, (mode, pts) in enumerate(lines.items()):
        colour = colours.get(mode, "black")
        steps = [pts[0]]
        for (t, v), (_, before) in zip(pts[1:], pts, strict=False):
            if v != before:  # a step line: only the changes
                steps += [(t, before), (t, v)]
        parts.append(line([*steps, pts[-1]], f'stroke="{colour}"'))
        parts.append(f'<text x="{width - 120}" y="{40 + 16 * i}" fill="{colour}">{mode}</text>')
    return "\n".join([*parts, "</svg>"]) + "\n"


__all__ = ["svg_plot"]
