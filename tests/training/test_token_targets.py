"""Auxiliary per-token targets must line up with LFM2-VL's image token grid (raster order, 32 px cells)."""

from training.examples import IGNORE
from training.scenes import Scene, Shape
from training.token_targets import BACKGROUND_COLOUR, BACKGROUND_KIND, GRID, POSITIONS, TARGET_CLASSES, token_targets


def _cells(grid, value):
    return {(r, c) for r in range(GRID) for c in range(GRID) if grid[r, c] == value}


def test_targets_mark_the_cells_a_shape_covers():
    # A blue square filling cells (row 1..2, col 5..6) exactly, and an orange circle at the bottom left.
    scene = Scene((Shape("square", "blue", 192, 64, 32), Shape("circle", "orange", 48, 208, 14)),
                  "plain", (230, 230, 230), 0)
    targets = token_targets(scene)
    assert set(targets) == set(TARGET_CLASSES)
    assert all(t.shape == (GRID * GRID,) for t in targets.values())
    kinds, colours = targets["kind"].view(GRID, GRID), targets["colour"].view(GRID, GRID)
    assert _cells(kinds, 1) == {(1, 5), (1, 6), (2, 5), (2, 6)}
    assert kinds[6, 1] == 0 and colours[6, 1] == 5  # circle, orange
    assert kinds[0, 0] == BACKGROUND_KIND and colours[0, 0] == BACKGROUND_COLOUR
    # "where" rides on the shape's cells only; the background has none.
    where = targets["where"].view(GRID, GRID)
    assert where[0, 0] == IGNORE
    assert {int(where[r, c]) for r, c in _cells(kinds, 1)} == {POSITIONS.index("none")}  # (+0.5, -0.5): no axis dominates
    assert where[6, 1] == POSITIONS.index("none")  # (-0.625, +0.625): neither


def test_every_cell_of_a_shape_knows_where_the_whole_shape_is():
    # Two purple squares (left and right) and a purple circle at the top.
    scene = Scene((Shape("square", "purple", 40, 128, 20), Shape("square", "purple", 216, 128, 20),
                   Shape("circle", "purple", 128, 30, 20)), "plain", (230, 230, 230), 0)
    targets = {key: value.view(GRID, GRID) for key, value in token_targets(scene).items()}
    squares, circles = _cells(targets["kind"], 1), _cells(targets["kind"], 0)
    assert squares and circles
    left = {POSITIONS[int(targets["where"][cell])] for cell in squares if cell[1] < GRID // 2}
    right = {POSITIONS[int(targets["where"][cell])] for cell in squares if cell[1] >= GRID // 2}
    assert left == {"left"} and right == {"right"}
    assert {POSITIONS[int(targets["where"][cell])] for cell in circles} == {"top"}


def test_twins_are_told_apart_by_the_cell_of_their_centre():
    # The two purple squares above share kind, colour and (vertically) place; only their centres differ.
    scene = Scene((Shape("square", "purple", 40, 128, 20), Shape("square", "purple", 216, 128, 20)),
                  "plain", (230, 230, 230), 0)
    targets = {key: value.view(GRID, GRID) for key, value in token_targets(scene).items()}
    squares = _cells(targets["kind"], 1)
    centres = {(int(targets["centre_row"][cell]), int(targets["centre_col"][cell])) for cell in squares}
    assert centres == {(128 // 32, 40 // 32), (128 // 32, 216 // 32)}
    for cell in squares:  # each cell names the centre of its own square, the nearer one
        assert int(targets["centre_col"][cell]) == (40 // 32 if cell[1] < GRID // 2 else 216 // 32)
    assert targets["centre_row"][0, 0] == IGNORE and targets["centre_col"][0, 0] == IGNORE  # background
