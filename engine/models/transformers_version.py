"""The transformers releases the engine is verified with, checked before a model loads.

The engine drives Hugging Face models below ``generate()``: it passes ``cache=`` to their forward and reads
``output.cache``, builds masks and positions itself, and copies cache layers row by row. Older releases name these
differently (``past_key_values``): there the first prefill fails with an AttributeError on every request, which on
a GPU host with its own older transformers looks like a model that never answers. So an older release is refused
at load with the version to install, and a newer one, not yet checked against ``generate()`` by the exactness
tests, loads with a warning.
"""
from __future__ import annotations

import logging

log = logging.getLogger("owlet.engine")

VERIFIED = (5, 24)  # requirements.txt pins transformers 5.24.x; tests/engine's exactness suite ran on it


def _major_minor(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def check(version: str | None = None) -> None:
    """Raise RuntimeError for a transformers older than the verified one; warn for a newer one."""
    if version is None:
        import transformers

        version = transformers.__version__
    found, verified = _major_minor(version), ".".join(map(str, VERIFIED))
    if found < VERIFIED:
        raise RuntimeError(f"transformers {version} is older than the {verified} Owlet's engine is verified with "
                           f"(its models' forward takes cache= and returns .cache from 5.24 on): install "
                           f"'transformers=={verified}.*' (requirements.txt pins it)")
    if found[0] != VERIFIED[0] or found[1] > VERIFIED[1]:
        log.warning("transformers %s is newer than the %s Owlet's engine is verified with; run the exactness "
                    "tests (tests/engine/test_exactness.py) before serving with it", version, verified)
