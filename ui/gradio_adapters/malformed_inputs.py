"""A sentence, not a bare failure, for an API call whose inputs Gradio cannot read.

Gradio converts each input before any handler runs (``Blocks.preprocess_data``). A message sent as a plain
string, a file that was not uploaded first, a length that is not a number: each raises inside Gradio, and
with ``show_error=False`` (Owlet never shows internal errors) the caller would get ``{"error": null}`` and no idea
what was wrong. Here such a failure becomes a ``gr.Error`` (the one kind Gradio always shows) naming the endpoint
and what it takes. The call is refused all the same: nothing runs, nothing is admitted, and a file the
client names on the server (``/etc/passwd``) is still never read. Gradio's own readable refusals (a slider
value out of range) are ``gr.Error`` already and pass through with their wording, logged as one budgeted line
instead of the traceback Gradio prints for each.
"""
from __future__ import annotations

import logging

import gradio as gr

from ui.gradio_adapters.internals import Patch, replace, require_parameters
from ui.shared.log_budget import LogBudget, first_line

log = logging.getLogger("owlet.ui")
refusals = LogBudget(log)

UPLOAD_FIRST = ("An image must be uploaded to this page first (gradio_client's handle_file does it); names of "
                "files on the server and URLs are not accepted.")


def usage_by_endpoint(max_new_tokens_cap: int) -> dict[str, str]:
    """What each public endpoint takes, in the words the refusal uses."""
    tokens = f"the longest answer as a whole number from 1 to {max_new_tokens_cap}"
    token = "your identity token from /identity"
    return {
        "chat": (f'/chat takes (message: {{"text": "...", "files": [one uploaded image, or none]}}, {tokens}, '
                 f"{token}). {UPLOAD_FIRST}"),
        "retry": f"/retry takes ({tokens}, {token}) and the chat's event data {{\"index\": N}}.",
        "edit": f"/edit takes ({tokens}, {token}) and the chat's event data {{\"index\": N, \"value\": new text}}.",
        "stop": f"/stop takes ({token}).",
        "new_conversation": f"/new_conversation takes ({token}).",
        "identity": "/identity takes (a token you were given before, or null).",
    }


def refusal(api_name: str | None, usage: dict[str, str]) -> str:
    how = usage.get(api_name or "", "send the inputs this endpoint lists at /gradio_api/info.")
    return f"This request could not be read: {how}"


def explain_malformed_inputs(page: gr.Blocks, usage: dict[str, str]) -> list[Patch]:
    """Make ``page`` answer unreadable inputs with ``refusal(...)`` instead of an empty error."""
    convert = require_parameters(page, "preprocess_data", ("block_fn", "inputs", "state", "explicit_call"))

    async def preprocess_data(block_fn, inputs, state, explicit_call=False):
        api_name = getattr(block_fn, "api_name", None)
        try:
            return await convert(block_fn, inputs, state, explicit_call)
        except gr.Error as exc:
            # Gradio's own readable refusal goes out as it is, but Gradio would also print its whole traceback,
            # one a request for any client sending an answer length of -5 (56 GB of log a day from one
            # address). A budgeted line instead, like every refusal.
            exc.print_exception = False
            refusals.warning("refused inputs to %s: %s", api_name, first_line(exc))
            raise
        except Exception as exc:
            # One line, without the inputs (Gradio's message lists them: the whole question, the identity token).
            refusals.warning("refused unreadable inputs to %s: %s: %s", api_name, type(exc).__name__,
                             first_line(exc))
            raise gr.Error(refusal(api_name, usage), print_exception=False) from exc

    return [replace(page, "preprocess_data", preprocess_data)]  # Blocks.process_api looks it up on the instance
