"""What a scene looks like in numbers, for reading a model's misses: each shape's size, how much of it shows,
how near it is to the nearest other shape, and whether it has a twin (a shape of the same kind and colour).

    python -m training.eval --scenes 500 --mode engine --show-failures 200 --explain

Most "describe" and count misses are one of three things: twins written once, a small shape touching a larger one
left out, or a kind or colour misread. Which one a miss is follows from the geometry printed here.
"""

from __future__ import annotations

import math

from training.scenes import Scene, Shape
from training.token_targets import visible_pixels


def gap(a: Shape, b: Shape) -> float:
    """Distance between the two shapes' bounding circles, in pixels (negative: they overlap)."""
    return math.hypot(a.x - b.x, a.y - b.y) - a.radius - b.radius


def shape_lines(scene: Scene) -> list[str]:
    """One line per shape: kind, colour, centre, radius, visible pixels, nearest gap, and its twin's gap if any."""
    visible = visible_pixels(scene).sum(0).tolist()
    lines = []
    for i, shape in enumerate(scene.shapes):
        others = [other for j, other in enumerate(scene.shapes) if j != i]
        twins = [other for other in others if (other.kind, other.colour) == (shape.kind, shape.colour)]
        nearest = min((gap(shape, other) for other in others), default=None)
        line = (f"{shape.colour} {shape.kind} at ({shape.x:.0f}, {shape.y:.0f}) r={shape.radius:.0f} "
                f"visible={visible[i]}px")
        if nearest is not None:
            line += f" nearest-gap={nearest:.0f}px"
        if twins:
            line += f" twin-gap={min(gap(shape, twin) for twin in twins):.0f}px"
        lines.append(line)
    return lines
