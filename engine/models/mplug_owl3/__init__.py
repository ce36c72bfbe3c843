"""mPLUG-Owl3 (hyper attention) served natively: no remote code, the published config and weight names.

Entry points for the engine (and the verified-families registry):
- ``is_mplug_owl3(folder)``: does this checkpoint folder hold an mPLUG-Owl3 model?
- ``load_runner(config)``: an ``OwlRunner`` for ``config.model``, behind the ModelRunner interface; its
  ``session_store_class`` keeps image K/V in session entries.

Modules: layout (the published weight layouts, told apart by weight names), config (config.json), model (torch
modules named after the weights), weights (loading, key checks), processor (chat, images, ``<|image|>``), runner
(prefill/decode), session (image K/V in the session store), reference (a plain forward for tests). Nothing is
imported or loaded at import time.
"""
from __future__ import annotations

import json
from pathlib import Path


def is_mplug_owl3(folder) -> bool:
    from .config import is_mplug_owl3_config

    path = Path(folder) / "config.json"
    try:
        return is_mplug_owl3_config(json.loads(path.read_text()))
    except (OSError, ValueError):
        return False


def load_runner(config):
    from .runner import OwlRunner

    return OwlRunner(config)
