"""Start a real Owlet stack for UI tests: Redis (found or embedded), a Celery worker serving the tiny
random-init LFM2-VL checkpoint, and the page, via the same launcher the demo uses.

The tiny model's answers are gibberish, so tests check structure (streaming, stats, errors), not words.
"""
from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


def load_launcher():
    """``scripts/run_demo.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("owlet_run_demo", ROOT / "scripts" / "run_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model() -> Path:
    from training.tiny_checkpoint import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint("lfm2vl")


def make_image(path: Path, colour=(200, 30, 30), size=(96, 64)) -> Path:
    from PIL import Image

    Image.new("RGB", size, colour).save(path)
    return path
