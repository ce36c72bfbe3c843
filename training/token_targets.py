"""Per-image-token targets for an auxiliary training loss: which shape kind and colour covers each token's cell.

LFM2-VL turns a 256 px image into an 8x8 grid of tokens (16 px patches, 2x2 merged), in raster order, each
covering a 32x32 px cell. Predicting the cell's shape kind and colour from the projector output gives the
vision tower a dense, direct signal; through the answers alone it learns colours quickly but shapes slowly.

Kind and colour are local; "where" needs the shape's centre against the picture's, which no single cell shows.
So a covered cell also predicts where its shape is (the "where" answer, or "none" when that question would not
be asked): the text side then reads the answer off any token of the shape it attends to, instead of comparing
rows and columns itself. A covered cell may also predict the cell that holds its shape's centre, which tells
two shapes of the same kind and colour apart (the "describe" misses are mostly such twins, one of them left out
or added). Each target beyond kind and colour has so far cost more in shape recognition than it gave ("where"
less so with a wider vision tower; the centre, and per-token counts of a shape's twins and kin, more): see the
model card.

Those targets name one shape per cell, the one covering most of it, so a small shape that covers no cell's
majority (radius 16-21 px beside a larger one: the "describe" misses that remain) is never a target at all. The
multi-label "present" target marks every (kind, colour) whose shape shows in a cell, however little of it.
Neither counts: two shapes of one kind and colour (twins) give tokens with the same targets, and the commonest
"describe" miss left is twins written once, even far apart. The multi-label "centres" target marks, in the one
cell that holds a shape's centre, that shape's (kind, colour): one mark per shape, so twins are two marks in two
cells, and the centre is also what "where" is asked about.
The heads that use these targets are dropped after training: the saved model is a plain LFM2-VL.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from PIL import Image, ImageDraw

from training.dialogues import position_of
from training.examples import IGNORE
from training.scenes import COLOUR_NAMES, IMAGE_SIZE, SHAPES, Scene, _shape_points

CELL = 32  # pixels per image token side (patch 16 x downsample 2)
GRID = IMAGE_SIZE // CELL
BACKGROUND_KIND, BACKGROUND_COLOUR = len(SHAPES), len(COLOUR_NAMES)
POSITIONS = ("left", "right", "top", "bottom", "none")
TARGET_CLASSES = {"kind": len(SHAPES) + 1, "colour": len(COLOUR_NAMES) + 1, "where": len(POSITIONS),
                  "centre_row": GRID, "centre_col": GRID}
_MIN_COVER = 0.15  # a cell belongs to a shape when the shape covers at least this share of it
# Multi-label targets: one 0/1 per class per token (binary cross-entropy), not one class per token.
# "present": every (kind, colour) showing in the cell; "centres": every (kind, colour) whose shape is centred in it.
MULTI_LABEL_CLASSES = {"present": len(SHAPES) * len(COLOUR_NAMES),  # (kind, colour) pairs, kind-major
                       "centres": len(SHAPES) * len(COLOUR_NAMES)}
_MIN_PRESENT = 0.04  # a shape shows in a cell from this share of it (41 of 1,024 px: more than a sliver)


def shape_index_map(scene: Scene) -> Image.Image:
    """An 'L' image: 0 for background, i + 1 where shape i is visible (drawn in render_scene's order)."""
    mask = Image.new("L", (IMAGE_SIZE, IMAGE_SIZE), 0)
    draw = ImageDraw.Draw(mask)
    order = sorted(range(len(scene.shapes)), key=lambda i: -scene.shapes[i].area)
    for i in order:
        shape = scene.shapes[i]
        if shape.kind == "circle":
            r = shape.radius
            draw.ellipse([shape.x - r, shape.y - r, shape.x + r, shape.y + r], fill=i + 1)
        else:
            draw.polygon(_shape_points(shape), fill=i + 1)
    return mask


@functools.lru_cache(maxsize=256)  # a training step asks twice per scene (class and label targets): draw it once
def visible_pixels(scene: Scene) -> torch.Tensor:
    """[cells, shapes]: how many of each cell's pixels (cells in raster order) show each shape. Read-only (cached)."""
    ids = torch.from_numpy(np.asarray(shape_index_map(scene), dtype=np.int64)).view(GRID, CELL, GRID, CELL)
    cells = ids.permute(0, 2, 1, 3).reshape(GRID * GRID, CELL * CELL)
    return torch.stack([(cells == i + 1).sum(1) for i in range(len(scene.shapes))], 1)


def label_targets(scene: Scene, keys=tuple(MULTI_LABEL_CLASSES)) -> dict[str, torch.Tensor]:
    """Per-token 0/1 labels for each of `keys` (of MULTI_LABEL_CLASSES), each [GRID * GRID, classes], raster order."""
    makers = {"present": presence_targets, "centres": centre_targets}
    return {key: makers[key](scene) for key in keys}


def _label_column(shape) -> int:
    return SHAPES.index(shape.kind) * len(COLOUR_NAMES) + COLOUR_NAMES.index(shape.colour)


def centre_targets(scene: Scene) -> torch.Tensor:
    """[GRID * GRID, MULTI_LABEL_CLASSES["centres"]] floats: 1 in the cell holding a shape's centre, in its
    (kind, colour) column. Twins whose centres fall in one cell make one mark."""
    centres = torch.zeros(GRID * GRID, MULTI_LABEL_CLASSES["centres"])
    for shape in scene.shapes:
        row = min(GRID - 1, max(0, int(shape.y) // CELL))
        col = min(GRID - 1, max(0, int(shape.x) // CELL))
        centres[row * GRID + col, _label_column(shape)] = 1.0
    return centres


def presence_targets(scene: Scene) -> torch.Tensor:
    """[GRID * GRID, MULTI_LABEL_CLASSES["present"]] floats: 1 where a (kind, colour) shape shows in the cell."""
    counts = visible_pixels(scene)
    present = torch.zeros(GRID * GRID, MULTI_LABEL_CLASSES["present"])
    for i, shape in enumerate(scene.shapes):
        present[counts[:, i] >= _MIN_PRESENT * CELL * CELL, _label_column(shape)] = 1.0
    return present


def token_targets(scene: Scene) -> dict[str, torch.Tensor]:
    """Per-token class for each of TARGET_CLASSES, each of shape [GRID * GRID], raster order.

    Background cells are kind/colour BACKGROUND_*, and IGNORE for "where" and the centre.
    """
    counts = visible_pixels(scene)
    targets = {key: torch.full((GRID * GRID,), value)
               for key, value in (("kind", BACKGROUND_KIND), ("colour", BACKGROUND_COLOUR), ("where", IGNORE),
                                          ("centre_row", IGNORE), ("centre_col", IGNORE))}
    best = counts.argmax(1)
    covered = counts.max(1).values >= _MIN_COVER * CELL * CELL
    for cell in covered.nonzero().flatten().tolist():
        shape = scene.shapes[best[cell]]
        targets["kind"][cell] = SHAPES.index(shape.kind)
        targets["colour"][cell] = COLOUR_NAMES.index(shape.colour)
        targets["where"][cell] = POSITIONS.index(position_of(shape) or "none")
        targets["centre_row"][cell] = min(GRID - 1, max(0, int(shape.y) // CELL))
        targets["centre_col"][cell] = min(GRID - 1, max(0, int(shape.x) // CELL))
    return targets
