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


def test_presence_marks_a_small_shape_in_the_cells_a_larger_one_holds():
    from training.scenes import COLOUR_NAMES, SHAPES
    from training.token_targets import MULTI_LABEL_CLASSES, label_targets

    # A big red square over cells (2..5, 2..5) and a small green star poking out of its right edge, centred on
    # the border of columns 5 and 6: in column 5 the square covers most of each cell.
    scene = Scene((Shape("square", "red", 128, 128, 60), Shape("star", "green", 192, 128, 18)),
                  "plain", (230, 230, 230), 0)
    present = label_targets(scene)["present"]
    assert present.shape == (GRID * GRID, MULTI_LABEL_CLASSES["present"])
    assert set(present.unique().tolist()) == {0.0, 1.0}
    square = SHAPES.index("square") * len(COLOUR_NAMES) + COLOUR_NAMES.index("red")
    star = SHAPES.index("star") * len(COLOUR_NAMES) + COLOUR_NAMES.index("green")
    grid = present.view(GRID, GRID, -1)
    kinds = token_targets(scene)["kind"].view(GRID, GRID)
    star_cells = {(r, c) for r in range(GRID) for c in range(GRID) if grid[r, c, star]}
    assert star_cells == {(3, 5), (4, 5), (3, 6), (4, 6)}
    assert all(grid[r, 5, square] for r in (3, 4))  # shared with the square in column 5
    # The one-class target names the star nowhere: the square holds column 5, and in column 6 the star covers too
    # little of any cell, so it is background there.
    assert not (kinds == SHAPES.index("star")).any()
    assert grid[0, 0].sum() == 0  # background: nothing shows
    assert present[:, [i for i in range(present.shape[1]) if i not in (square, star)]].sum() == 0


def test_centres_mark_each_twin_once_in_the_cell_of_its_centre():
    from training.scenes import COLOUR_NAMES, SHAPES
    from training.token_targets import MULTI_LABEL_CLASSES, label_targets

    # Two purple squares far apart (same kind and colour: "present" and the class targets cannot tell one from
    # two) and a red circle whose centre sits exactly on a cell border (it counts in the cell it starts).
    scene = Scene((Shape("square", "purple", 40, 128, 20), Shape("square", "purple", 216, 128, 20),
                   Shape("circle", "red", 128, 64, 20)), "plain", (230, 230, 230), 0)
    centres = label_targets(scene)["centres"]
    assert centres.shape == (GRID * GRID, MULTI_LABEL_CLASSES["centres"])
    square = SHAPES.index("square") * len(COLOUR_NAMES) + COLOUR_NAMES.index("purple")
    circle = SHAPES.index("circle") * len(COLOUR_NAMES) + COLOUR_NAMES.index("red")
    grid = centres.view(GRID, GRID, -1)
    marked = {(r, c, k) for r, c, k in grid.nonzero().tolist()}
    assert marked == {(4, 1, square), (4, 6, square), (2, 4, circle)}  # one mark per shape, twins in two cells
    # "present" marks every cell a twin shows in, so it sees one kind-and-colour over many cells.
    present = label_targets(scene)["present"].view(GRID, GRID, -1)
    assert int(present[..., square].sum()) > 2


def test_label_targets_builds_only_the_labels_asked_for():
    from training.token_targets import label_targets

    scene = Scene((Shape("circle", "red", 128, 64, 20),), "plain", (230, 230, 230), 0)
    assert set(label_targets(scene, ("centres",))) == {"centres"}
    assert set(label_targets(scene)) == {"present", "centres"}
