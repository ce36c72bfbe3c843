"""The one parser for Owlet's environment variables, used by the engine, the worker and the page alike.

One set of rules, so ``on`` means the same everywhere and a bad value is an error everywhere:

- booleans: ``1 true yes on`` / ``0 false no off`` (any case); anything else raises;
- integers and floats: Python's ``int()`` / ``float()``, floats finite only; optional numbers also accept
  ``none``;
- an empty variable counts as unset (compose writes ``OWLET_X: ${OWLET_X:-}``).

Each settings dataclass (``engine.EngineConfig``, ``worker.config.Settings``, ``ui.config.UIConfig``) calls
:func:`read_fields` with its prefix; the variable for field ``max_running`` is ``OWLET_MAX_RUNNING``.
:func:`env_names` lists every variable a dataclass reads, which is what the documentation test compares
with docs/configuration.md. Standard library only: the engine imports this, and it must stay free of Celery, Redis
and Gradio.
"""
from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingError(ValueError):
    """A variable has a value Owlet cannot use; the message names the variable and what it accepts."""


def parse_bool(name: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean: use one of {'/'.join(TRUE_WORDS)} or "
                       f"{'/'.join(FALSE_WORDS)}")


def parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not an integer") from None


def parse_float(name: str, raw: str) -> float:
    """A finite number: every float Owlet reads is a size, a time or a share, and Python's ``float()`` also takes
    "nan" and "inf", which no limit can mean (a NaN budget failed at start as "cannot convert float NaN to integer";
    an endless deadline started and failed at the first cancel)."""
    try:
        value = float(raw.strip())
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingError(f"{name}={raw!r} is not a finite number")
    return value


def parse_value(name: str, raw: str, annotation) -> object:
    """Parse ``raw`` for a field annotated ``annotation`` (a type or its string form, as dataclasses keep it)."""
    base, optional = _base_type(annotation)
    if optional and raw.strip().lower() == "none":
        return None
    if base is bool:
        return parse_bool(name, raw)
    if base is int:
        return parse_int(name, raw)
    if base is float:
        return parse_float(name, raw)
    return raw


def read_fields(cls, prefix: str, env: Mapping[str, str] | None = None, *, skip: Iterable[str] = (),
                custom: Mapping[str, Callable[[str, str], object]] | None = None) -> dict:
    """``{field: value}`` for every field of dataclass ``cls`` whose ``<prefix><FIELD>`` variable is set.

    ``skip`` names fields that are not read from the environment (they come from elsewhere, e.g. flags);
    ``custom`` gives a parser ``(variable, raw) -> value`` for fields that are not plain scalars.
    """
    env = os.environ if env is None else env
    custom = custom or {}
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        name = prefix + f.name.upper()
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        parser = custom.get(f.name)
        values[f.name] = parser(name, raw) if parser else parse_value(name, raw, f.type)
    return values


def env_names(cls, prefix: str, *, skip: Iterable[str] = ()) -> list[str]:
    """The variables :func:`read_fields` reads for ``cls`` with the same ``prefix`` and ``skip``."""
    return [prefix + f.name.upper() for f in dataclasses.fields(cls) if f.name not in skip]


def _base_type(annotation) -> tuple[type | None, bool]:
    """(bool|int|float|str|None, optional?) for annotations such as ``int``, ``"float | None"``."""
    if isinstance(annotation, str):
        parts = [p.strip() for p in annotation.split("|")]
        optional = "None" in parts
        named = [p for p in parts if p != "None"]
        lookup = {"bool": bool, "int": int, "float": float, "str": str}
        return (lookup.get(named[0]) if len(named) == 1 else None), optional
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        named = [a for a in args if a is not type(None)]
        return (named[0] if len(named) == 1 else None), type(None) in args
    return annotation, False
