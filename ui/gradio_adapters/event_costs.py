"""Start-up tweaks that take fixed costs out of every Gradio event (``bench/page_stream.py --profile`` shows
them). Each one leaves behaviour unchanged.
"""
from __future__ import annotations

import importlib.util
import sys

from ui.gradio_adapters.internals import Patch, queue_of, replace, require, require_type


def skip_missing_matplotlib() -> None:
    """Gradio wraps every event (each streamed update too) in ``import matplotlib`` twice, to switch its
    plotting backend. Where matplotlib is not installed, each failed import searches all of ``sys.path``:
    about a millisecond per update. Recording the module as absent makes that import fail at once, exactly
    as it would anyway. (Not an adaptation of Gradio's internals: it holds whatever Gradio does.)"""
    if "matplotlib" not in sys.modules and importlib.util.find_spec("matplotlib") is None:
        sys.modules["matplotlib"] = None  # "import matplotlib" now raises ImportError without a search


def calm_idle_queue(page, poll_s: float = 0.005, progress_poll_s: float = 0.1) -> list[Patch]:
    """Gradio's queue looks for newly queued events every 1 ms (and for progress bars every 10 ms), even when
    nothing is waiting: a busy loop that cost the idle page about 0.05 of a core. Polling every ``poll_s``
    adds at most that much to the start of an event (not to streamed updates, which do not pass through
    it). The page shows no progress bars, so their poll slows to ``progress_poll_s``."""
    queue = queue_of(page)
    polls = {"sleep_when_free": poll_s, "progress_update_sleep_when_free": progress_poll_s}
    for name in polls:
        require_type(queue, name, (int, float))
    return [replace(queue, name, max(getattr(queue, name), least)) for name, least in polls.items()]


_SCHEMAS: dict[tuple[type, type], dict] = {}  # (component class, its data model) -> the API schema


def share_component_schemas() -> list[Patch]:
    """A handler that returns a component update (the input box locked at a turn's start, unlocked at its end)
    makes Gradio build a new component instance and its config, and the config includes the component's API
    schema, generated afresh by pydantic for every new instance (its cache lives on the instance): 4.3 ms per
    update on this project's AMD EPYC CPU, twice per turn. The schema follows from the component's class and
    data model alone, so it is computed once per pair and shared. Classes with their own ``api_info`` are left
    as they are."""
    import gradio as gr
    from gradio.components.base import Component

    original = require(Component, "api_info")
    if getattr(original, "owlet_shared", False):
        return [Patch(Component, "api_info", original)]
    probe = gr.Textbox()
    require(probe, "_api_info_cache")
    require(probe, "data_model")

    def api_info(self):
        if self._api_info_cache is None and self.data_model is not None:
            key = (type(self), self.data_model)
            if key not in _SCHEMAS:
                _SCHEMAS[key] = original(self)
            self._api_info_cache = _SCHEMAS[key]
        return original(self)

    api_info.owlet_shared = True
    return [replace(Component, "api_info", api_info)]


def drop_queue_analytics(page) -> list[Patch]:
    """Gradio's queue records every event for its traffic-monitoring dashboard and, at the end of every event,
    rebuilds a summary from up to 10,000 of those records with pandas (a DataFrame, a group-by, percentiles):
    4 ms per event with 300 records and 14 ms with 10,000 on this project's AMD EPYC CPU, so a long-running
    page paid more per turn the longer it ran. Owlet serves its own metrics (``/metrics``, token-protected) and
    launches with ``enable_monitoring=False``, so nothing reads that summary: it is never rebuilt, and one
    record is kept (the queue still looks each event's record up)."""
    queue = queue_of(page)
    every = "ANAYLTICS_CACHE_FREQUENCY"  # (sic: Gradio's spelling) "rebuild after this many new events"
    require_type(queue, every, int)
    require_type(queue, "ANALYTICS_MAX_EVENTS", int)
    return [replace(queue, every, sys.maxsize), replace(queue, "ANALYTICS_MAX_EVENTS", 1)]
