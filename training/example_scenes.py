"""The scenes behind the page's clickable examples (ui/examples/*.png), with a suggested first question each.

Hand-placed so the right answers are plain to read; the answers follow the generator's own rules
(training/dialogues.py), and tests check both the pictures and the answers. Regenerate the PNGs with
`python -m training.example_scenes` after changing a scene.
"""

from __future__ import annotations

import json
from pathlib import Path

from training.dialogues import Turn, describe
from training.scenes import Scene, Shape, render_scene

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "ui" / "examples"
MANIFEST = EXAMPLES_DIR / "examples.json"

# name -> (scene, suggested first question with its right answer)
EXAMPLES: dict[str, tuple[Scene, Turn]] = {
    "three-shapes": (
        Scene((Shape("circle", "red", 60, 128, 32), Shape("square", "blue", 200, 120, 24),
               Shape("star", "yellow", 128, 210, 26)), "stripes", (225, 225, 215), 1),
        Turn("describe", "Describe the image.", "a red circle, a blue square and a yellow star"),
    ),
    "two-triangles": (
        Scene((Shape("triangle", "green", 128, 70, 44), Shape("triangle", "purple", 70, 190, 20)),
              "plain", (240, 235, 230), 2),
        Turn("count", "How many triangles are there?", "2"),
    ),
    "star-on-the-left": (
        Scene((Shape("star", "orange", 48, 130, 30), Shape("circle", "green", 190, 60, 22)),
              "checker", (230, 235, 240), 3),
        Turn("where", "Where is the star?", "left"),
    ),
}


def write_examples(out_dir: Path = EXAMPLES_DIR) -> list[dict]:
    """Render every example to <name>.png and write the manifest the page reads (file and question only)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, (scene, turn) in EXAMPLES.items():
        render_scene(scene).save(out_dir / f"{name}.png", optimize=True)
        manifest.append({"file": f"{name}.png", "question": turn.question})
    (out_dir / "examples.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


if __name__ == "__main__":
    print(json.dumps(write_examples(), indent=2))
