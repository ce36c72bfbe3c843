"""Auxiliary per-token targets must line up with LFM2-VL's image token grid (raster order, 32 px cells)."""

from training.scenes import Scene, Shape
from training.token_targets import BACKGROUND_COLOUR, BACKGROUND_KIND, GRID, token_targets


def test_targets_mark_the_cells_a_shape_covers():
    # A blue square filling cells (row 1..2, col 5..6) exactly, and an orange circle at the bottom left.
    scene = Scene((Shape("square", "blue", 192, 64, 32), Shape("circle", "orange", 48, 208, 14)),
                  "plain", (230, 230, 230), 0)
    kinds, colours = token_targets(scene)
    assert kinds.shape == colours.shape == (GRID * GRID,)
    grid = kinds.view(GRID, GRID)
    square_cells = {(r, c) for r in range(GRID) for c in range(GRID) if grid[r, c] == 1}
    assert square_cells == {(1, 5), (1, 6), (2, 5), (2, 6)}
    assert grid[6, 1] == 0 and colours.view(GRID, GRID)[6, 1] == 5  # circle, orange
    assert grid[0, 0] == BACKGROUND_KIND and colours[0] == BACKGROUND_COLOUR
