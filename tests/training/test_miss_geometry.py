"""The eval's --explain lines: a miss is read against the scene's geometry (twins, gaps, what shows)."""

from training.eval import print_report
from training.examples import Example
from training.miss_geometry import gap, shape_lines
from training.scenes import Scene, Shape


def _scene():
    # Two red stars 100 px apart (twins), and a small blue square whose bounding circle overlaps the right one's.
    return Scene((Shape("star", "red", 50, 128, 20), Shape("star", "red", 190, 128, 20),
                  Shape("square", "blue", 215, 128, 10)), "plain", (230, 230, 230), 0)


def test_lines_name_twins_gaps_and_what_shows():
    scene = _scene()
    assert gap(scene.shapes[0], scene.shapes[1]) == 100
    lines = shape_lines(scene)
    assert len(lines) == 3
    assert lines[0].startswith("red star at (50, 128) r=20") and "twin-gap=100px" in lines[0]
    assert "nearest-gap=100px" in lines[0]
    assert "twin-gap" not in lines[2] and "nearest-gap=-5px" in lines[2]  # centres 25 px apart, radii 20 + 10
    # The square is drawn over the star (smaller shapes on top): all of its 21 x 21 px show, and the right star
    # shows less of itself than its twin.
    assert "visible=441px" in lines[2]
    visible = [int(line.split("visible=")[1].split("px")[0]) for line in lines[:2]]
    assert visible[1] < visible[0]


def test_report_prints_the_geometry_under_each_scene_miss(capsys):
    report = {"per_type": {}, "per_type_count": {}, "per_turn": {}, "questions": 1, "accuracy": 0.0,
              "in_domain_refusal_rate": 0.0, "ood_reply_rate": None,
              "failures": [{"scene": 0, "turn": 1, "question": "describe the image.",
                            "expected": "a red star and a red star", "got": "a red star"},
                           {"probe": 3, "family": "photo", "turn": 1, "question": "what is this?", "got": "1"}]}
    print_report(report, 10, [Example(None, [], _scene())])
    out = capsys.readouterr().out
    assert out.count("twin-gap=100px") == 2
    assert out.index("miss: {\"probe\"") > out.index("blue square")  # geometry follows its own miss only
