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


def calm_idle_queue(page, poll_s: float = 0.005, progress_poll_s: float = 0.1) -> None:
    """Gradio's queue looks for newly queued events every 1 ms (and for progress bars every 10 ms), even when
    nothing is waiting: a busy loop that cost the idle page about 0.05 of a core. Polling every ``poll_s``
    adds at most that much to the start of an event (not to streamed updates, which do not pass through
    it). The page shows no progress bars, so their poll slows to ``progress_poll_s``."""
    queue = getattr(page, "_queue", None)
    if queue is None or not hasattr(queue, "sleep_when_free"):
        return  # another Gradio version: nothing to tune
    queue.sleep_when_free = max(queue.sleep_when_free, poll_s)
    if hasattr(queue, "progress_update_sleep_when_free"):
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, progress_poll_s)


_SCHEMAS: dict[tuple[type, type], dict] = {}  # (component class, its data model) -> the API schema


def share_component_schemas() -> None:
    """A handler that returns a component update (the input box locked at a turn's start, unlocked at its end)
    makes Gradio build a new component instance and its config, and the config includes the component's API
    schema, generated afresh by pydantic for every new instance (its cache lives on the instance): 4.3 ms per
    update on this project's AMD EPYC CPU, twice per turn. The schema follows from the component's class and
    data model alone, so it is computed once per pair and shared. Classes with their own ``api_info`` are left
    as they are."""
    from gradio.components.base import Component

    original = Component.api_info
    if getattr(original, "owlet_shared", False):
        return

    def api_info(self):
        if self._api_info_cache is None and self.data_model is not None:
            key = (type(self), self.data_model)
            if key not in _SCHEMAS:
                _SCHEMAS[key] = original(self)
            self._api_info_cache = _SCHEMAS[key]
        return original(self)

    api_info.owlet_shared = True
    Component.api_info = api_info


def drop_queue_analytics(page) -> None:
    """Gradio's queue records every event for its traffic-monitoring dashboard and, at the end of every event,
    rebuilds a summary from up to 10,000 of those records with pandas (a DataFrame, a group-by, percentiles):
    4 ms per event with 300 records and 14 ms with 10,000 on this project's AMD EPYC CPU, so a long-running
    page paid more per turn the longer it ran. Owlet serves its own metrics (``/metrics``, token-protected) and
    launches with ``enable_monitoring=False``, so nothing reads that summary: it is never rebuilt, and one
    record is kept (the queue still looks each event's record up)."""
    queue = getattr(page, "_queue", None)
    if queue is None or not hasattr(queue, "ANAYLTICS_CACHE_FREQUENCY"):  # (sic: Gradio's spelling)
        return  # another Gradio version: nothing to tune
    queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize  # "rebuild after this many new events": never
    queue.ANALYTICS_MAX_EVENTS = 1


def forget_replaced_components(page) -> None:
    """Keep a session's Gradio config at the page's own components, however many events the session runs.

    Every prop update (the input box locked and unlocked, each answer) makes Gradio build a new instance of the
    output component and store it in the session's config; when a later update starts from that instance, the
    next one lands under the instance's own, new id instead of replacing it. The session then kept one component
    per update, with the config built from it and its value, for its life: a hostile audit (2026-12-02) grew the
    page by 0.85 MB a turn with 900 KB questions refused as too long (the box hands a refused question back) and
    by about 6 KB a turn with short ones, from one session, with no identity needed. Owlet's page makes no
    components at run time (no ``gr.render``), so after each event every id the page was not built with is
    dropped from the session's config."""
    built = frozenset(page.blocks)
    postprocess = page.postprocess_data

    async def postprocess_data(block_fn, predictions, state, *args, **kwargs):
        try:
            return await postprocess(block_fn, predictions, state, *args, **kwargs)
        finally:
            if state is not None:
                _drop_unbuilt(state, built)

    page.postprocess_data = postprocess_data  # Blocks.process_api looks it up on the instance


def _drop_unbuilt(state, built: frozenset) -> None:
    blocks = getattr(getattr(state, "blocks_config", None), "blocks", None)
    if not isinstance(blocks, dict):
        return  # another Gradio version
    for key in [key for key in list(blocks) if key not in built]:
        blocks.pop(key, None)
        getattr(state, "config_values", {}).pop(key, None)
