"""What the demo checks before it starts anything: every setting of every process it will start, and the model.

A bad value in the environment would otherwise stop the demo with a traceback (the demo reads a few settings
itself), or stop the worker after Redis and the page were started for nothing. Each check returns one sentence
that says what is wrong and what to do, or None.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def settings_problem(model: str, env: Mapping[str, str] | None = None) -> str | None:
    """The first setting the engine, the worker or the page would refuse, as they would say it; None if all
    parse. Reads the environment exactly as each of them does (``owlet.settings``)."""
    from engine.config import EngineConfig
    from owlet.settings import SettingError
    from ui.config import UIConfig
    from worker.config import Settings

    env = os.environ if env is None else env
    try:
        EngineConfig.from_env(env, model=model)
        Settings.from_env(env)
        UIConfig.from_env(env)
    except (SettingError, ValueError, AssertionError) as exc:
        return str(exc) or type(exc).__name__
    return None


def model_problem(model: str, bundled: Path, env: Mapping[str, str] | None = None) -> str | None:
    """Why the worker could not serve ``model`` (the checks it runs itself before loading, ``worker.serving
    .startup``), with the fix: for the bundled model, how it is restored or made again; for a folder the user
    named, what a model folder holds."""
    from worker.serving.startup import CannotServe, check_engine_environment

    env = dict(os.environ if env is None else env, OWLET_MODEL=str(model))
    try:
        check_engine_environment(env)
    except CannotServe as exc:
        if Path(model).expanduser().resolve() == bundled.resolve():
            from training.recipe import SHIPPED_RECIPE

            return (f"the bundled model is missing or incomplete at {bundled}: restore it (git checkout -- "
                    f"models/{bundled.name}), or make it again with .venv/bin/python -m training.train --recipe "
                    f"{SHIPPED_RECIPE} --out models/{bundled.name} (40 to 60 minutes on 2 cores)")
        return f"{exc} Leave out --model (and OWLET_MODEL) to serve the bundled demo model."
    return None
