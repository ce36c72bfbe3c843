"""An older transformers is refused before a model loads, with the version to install; a newer one warns."""
from __future__ import annotations

import logging

import pytest
import transformers

from engine.models import transformers_version
from engine.config import EngineConfig
from engine.models.runners import make_runner


def test_an_older_transformers_is_refused_with_the_version_to_install():
    refusal = r"transformers 5\.17\.0 is older than the 5\.24.*install 'transformers==5\.24"
    with pytest.raises(RuntimeError, match=refusal):
        transformers_version.check("5.17.0")


def test_the_verified_release_loads_quietly_and_a_newer_one_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="owlet.engine"):
        transformers_version.check("5.24.0")
        transformers_version.check("5.24.3")
        assert not caplog.records
        transformers_version.check("5.30.0.dev0")
    assert "newer than the 5.24" in caplog.text


def test_the_installed_release_is_the_verified_one():
    assert transformers_version._major_minor(transformers.__version__) == transformers_version.VERIFIED


def test_make_runner_checks_before_loading(monkeypatch, tmp_path):
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    with pytest.raises(RuntimeError, match="older than"):
        make_runner(EngineConfig(model=str(tmp_path)))  # an empty folder: refused before anything is read
