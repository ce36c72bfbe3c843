"""Start-up tweaks that take fixed costs out of every Gradio event, found by profiling the page
(``bench/page_stream.py --profile``). Each one leaves behaviour unchanged.
"""
from __future__ import annotations

import importlib.util
import sys


def skip_missing_matplotlib() -> None:
    """Gradio wraps every event (each streamed update too) in ``import matplotlib`` twice, to switch its
    plotting backend. Where matplotlib is not installed, each failed import searches all of ``sys.path``:
    about a millisecond per update. Recording the module as absent makes that import fail at once, exactly
    as it would anyway."""
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None  # "import matplotlib" now raises ImportError without a search
