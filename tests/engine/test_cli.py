"""README's one-question command, ``python -m engine --image photo.jpg "..."``, run as a user runs it (from another
folder, with OWLET_MODEL set): it answers about a picture, and a picture it cannot read is refused before the model
loads, in a sentence (it was a traceback after the load)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "owlet-shapes-vl"


def ask(tmp_path, *argv: str, **settings: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OWLET_MODEL": str(BUNDLED), "OWLET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", **settings})
    return subprocess.run([sys.executable, "-m", "engine", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_it_answers_about_a_picture(tmp_path):
    from PIL import Image

    Image.new("RGB", (96, 64), (200, 30, 30)).save(tmp_path / "photo.jpg")
    run = ask(tmp_path, "--image", "photo.jpg", "--max-new-tokens", "8", "What is in this picture?")
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() and "prompt tokens" in run.stderr


def test_a_model_folder_named_from_home_as_a_settings_file_leaves_it(tmp_path):
    """OWLET_MODEL=~/models/... in a .env file or a quoted setting reaches the process with its "~": the worker's
    checks expanded it, the engine did not ("no such folder")."""
    import shutil

    shutil.copytree(BUNDLED, tmp_path / "models" / BUNDLED.name)
    run = ask(tmp_path, "--max-new-tokens", "4", "Hello?", OWLET_MODEL=f"~/models/{BUNDLED.name}", HOME=str(tmp_path))
    assert run.returncode == 0 and "prompt tokens" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("make, says", [
    (lambda folder: folder / "missing.jpg", "missing.jpg: No such file or directory"),
    (lambda folder: folder, "Is a directory"),
    (lambda folder: (folder / "notes.jpg").write_text("not a picture") and folder / "notes.jpg",
     "not a picture (no image format recognised in it)"),
])
def test_a_picture_it_cannot_read_is_refused_before_the_model_loads(tmp_path, make, says):
    run = ask(tmp_path, "--image", str(make(tmp_path)), "What is it?")
    assert run.returncode == 2 and says in run.stderr, (run.returncode, run.stderr[-2000:])
    assert "loaded" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
