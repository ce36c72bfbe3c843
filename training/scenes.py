"""Procedural shape scenes: 1-4 coloured shapes on a plain or textured background, from a seeded RNG.

A `Scene` is pure data (what is where); `render_scene` draws it. Keeping the two apart lets the question
generator reason about the ground truth without looking at pixels.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

IMAGE_SIZE = 256  # 256 px -> exactly 64 image tokens with LFM2-VL's default patch 16 / downsample 2

SHAPES = ("circle", "square", "triangle", "star")
# Saturated, well separated hues so that "what colour" has one right answer even under overlap.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 210, 20),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
}
COLOUR_NAMES = tuple(COLOURS)

MIN_RADIUS, MAX_RADIUS = 16, 52  # half of the shape's bounding box, in pixels


@dataclass(frozen=True)
class Shape:
    kind: str  # one of SHAPES
    colour: str  # one of COLOUR_NAMES
    x: float  # centre, pixels
    y: float
    radius: float  # half the bounding-box side

    @property
    def area(self) -> float:
        """Approximate filled area; used to decide which shape is the largest."""
        factor = {"circle": math.pi, "square": 4.0, "triangle": 1.3, "star": 1.1}[self.kind]
        return factor * self.radius**2


@dataclass(frozen=True)
class Scene:
    shapes: tuple[Shape, ...]
    background: str  # "plain", "stripes", "checker" or "noise"
    background_tone: tuple[int, int, int]
    seed: int  # seed of the texture noise, so rendering is deterministic


def _overlap_fraction(a: Shape, b: Shape) -> float:
    """How much of the smaller shape's circle is covered by the other's, roughly (0 = apart, 1 = inside)."""
    d = math.hypot(a.x - b.x, a.y - b.y)
    small = min(a.radius, b.radius)
    return max(0.0, min(1.0, (a.radius + b.radius - d) / (2 * small)))


def generate_scene(rng: random.Random, twins: bool = False) -> Scene:
    """Draw a random scene. Overlap is allowed (sometimes) but never enough to hide a shape.

    With `twins` the scene has 2-4 shapes and its second has the first's kind and colour (its size and place drawn
    as usual); without, the draws are exactly those of the plain scene."""
    n = rng.randint(2, 4) if twins else rng.randint(1, 4)
    allow_overlap = rng.random() < 0.25
    shapes: list[Shape] = []
    while len(shapes) < n:
        radius = rng.uniform(MIN_RADIUS, MAX_RADIUS if n <= 2 else MAX_RADIUS - 10)
        margin = radius + 4
        shape = Shape(
            kind=rng.choice(SHAPES),
            colour=rng.choice(COLOUR_NAMES),
            x=rng.uniform(margin, IMAGE_SIZE - margin),
            y=rng.uniform(margin, IMAGE_SIZE - margin),
            radius=radius,
        )
        if twins and len(shapes) == 1:
            shape = Shape(shapes[0].kind, shapes[0].colour, shape.x, shape.y, shape.radius)
        limit = 0.35 if allow_overlap else 0.0
        if all(_overlap_fraction(shape, other) <= limit for other in shapes):
            shapes.append(shape)
    background = rng.choice(("plain", "plain", "stripes", "checker", "noise"))
    tone = tuple(rng.randint(200, 250) for _ in range(3))
    return Scene(tuple(shapes), background, tone, rng.randrange(2**31))


def _shape_points(shape: Shape) -> list[tuple[float, float]]:
    x, y, r = shape.x, shape.y, shape.radius
    if shape.kind == "square":
        return [(x - r, y - r), (x + r, y - r), (x + r, y + r), (x - r, y + r)]
    if shape.kind == "triangle":
        return [(x, y - r), (x + r, y + r * 0.85), (x - r, y + r * 0.85)]
    points = []  # five-pointed star
    for i in range(10):
        angle = -math.pi / 2 + i * math.pi / 5
        reach = r if i % 2 == 0 else r * 0.45
        points.append((x + reach * math.cos(angle), y + reach * math.sin(angle)))
    return points


def _draw_background(draw: ImageDraw.ImageDraw, scene: Scene) -> None:
    tone = scene.background_tone
    darker = tuple(max(0, c - 35) for c in tone)
    if scene.background == "stripes":
        for offset in range(-IMAGE_SIZE, IMAGE_SIZE, 16):
            draw.line([(offset, 0), (offset + IMAGE_SIZE, IMAGE_SIZE)], fill=darker, width=4)
    elif scene.background == "checker":
        for row in range(0, IMAGE_SIZE, 32):
            for col in range(0, IMAGE_SIZE, 32):
                if (row + col) // 32 % 2:
                    draw.rectangle([col, row, col + 31, row + 31], fill=darker)
    elif scene.background == "noise":
        noise = random.Random(scene.seed)
        for _ in range(600):
            px, py = noise.randrange(IMAGE_SIZE), noise.randrange(IMAGE_SIZE)
            draw.rectangle([px, py, px + 2, py + 2], fill=darker)


def render_scene(scene: Scene) -> Image.Image:
    """Draw the scene as an RGB PIL image. Larger shapes first, so smaller ones stay visible on top."""
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), scene.background_tone)
    draw = ImageDraw.Draw(image)
    _draw_background(draw, scene)
    for shape in sorted(scene.shapes, key=lambda s: -s.area):
        fill = COLOURS[shape.colour]
        if shape.kind == "circle":
            r = shape.radius
            draw.ellipse([shape.x - r, shape.y - r, shape.x + r, shape.y + r], fill=fill)
        else:
            draw.polygon(_shape_points(shape), fill=fill)
    return image
