"""Making a model's runner: the family row (engine/models/families.py) says which runner class serves a checkpoint.

The generic ``ModelRunner`` serves every family Hugging Face runs natively; a row's ``runner`` ("module:Class")
names a custom one (mPLUG-Owl3). This module sits beside the runners and imports them, so the registry itself
imports no runner.
"""
from __future__ import annotations

import importlib

from . import transformers_version
from .families import FAMILIES, Family, resolve
from .model_runner import ModelRunner


def runner_class(family: Family) -> type:
    """The runner class serving ``family``: its custom one if the row names one, else the generic runner."""
    if family.runner is None:
        return ModelRunner
    module, _, name = family.runner.partition(":")
    return getattr(importlib.import_module(module), name)


def make_runner(config, families=FAMILIES):
    """Load the checkpoint ``config.model`` with the runner its family needs (refusing unverified ones, and a
    transformers older than the engine is verified with)."""
    transformers_version.check()
    family = resolve(config.model, config.allow_unverified, families)
    return runner_class(family)(config, family=family)
