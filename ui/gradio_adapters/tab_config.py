"""A tab's Gradio config kept at the page's own components, however many events the tab runs.

Every prop update (the input box locked and unlocked, each answer) makes Gradio build a new instance of the output
component and store it in the tab's config (its ``SessionState``); when a later update starts from that instance,
the next one lands under the instance's own, new id instead of replacing it. The tab then kept one component per
update, with the config built from it and its value, for its life: 0.85 MB a turn with 900 KB questions refused as
too long (the box hands a refused question back) and about 6 KB a turn with short ones, from one tab, with no
identity needed. Owlet's page makes no components at run time (no ``gr.render``), so after each event every id the
page was not built with is dropped from the tab's config.
"""
from __future__ import annotations

from ui.gradio_adapters.internals import NotAdaptable, Patch, replace, require_parameters, session_config


def forget_replaced_components(page) -> list[Patch]:
    """Wrap ``page.postprocess_data`` (``Blocks.process_api`` looks it up on the instance) so that, after each
    event, the tab's config holds only the components the page was built with."""
    from gradio.state_holder import SessionState

    postprocess = require_parameters(page, "postprocess_data", ("block_fn", "predictions", "state"))
    blocks, values = session_config(SessionState(page))
    if not isinstance(blocks, dict) or not isinstance(values, dict):
        raise NotAdaptable("SessionState.blocks_config.blocks or .config_values is not a dict")
    built = frozenset(page.blocks)

    async def postprocess_data(block_fn, predictions, state, *args, **kwargs):
        try:
            return await postprocess(block_fn, predictions, state, *args, **kwargs)
        finally:
            if state is not None:
                _drop_unbuilt(state, built)

    return [replace(page, "postprocess_data", postprocess_data)]


def _drop_unbuilt(state, built: frozenset) -> None:
    blocks, values = session_config(state)
    for key in [key for key in list(blocks) if key not in built]:
        blocks.pop(key, None)
        values.pop(key, None)
