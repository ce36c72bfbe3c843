"""Fixtures for the shipped demo checkpoint (models/owlet-shapes-vl); OWLET_DEMO_MODEL overrides its path."""

import os
from pathlib import Path

import pytest

from training.demo_model import DEFAULT_MODEL_DIR


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    path = Path(os.environ.get("OWLET_DEMO_MODEL", DEFAULT_MODEL_DIR))
    assert (path / "config.json").exists(), f"demo checkpoint missing at {path}; run python -m training.train"
    return path
