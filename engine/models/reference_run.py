"""Reference runs: the model's own code, on one thread, while the engine's kernels stay installed.

The engine's CPU kernels (engine/models/cpu/) replace some of the model's modules' forwards in place. A reference run
(``model.generate()`` on the engine's own model object, as the exactness tests do, while the engine keeps serving)
must compute exactly what the model's own code computes, so every replaced forward checks ``in_reference_run()``
and steps aside for the original. The flag is per thread: the engine's thread keeps its kernels meanwhile.

It lives in the engine core, not in engine/models/cpu/, so a reference run reads the same whether the kernels are
installed, turned off, or not importable at all.
"""
from __future__ import annotations

import contextlib
import threading

_local = threading.local()


@contextlib.contextmanager
def reference_run():
    """Within this block, on this thread only, the model runs its own code (no kernel of the engine's)."""
    before = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def in_reference_run() -> bool:
    """Whether this thread is inside ``reference_run()``."""
    return getattr(_local, "on", False)
