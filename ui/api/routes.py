"""The OpenAI-compatible API's routes, served by the page process next to the page (``ui.server``).

- ``POST /v1/chat/completions``: a chat turn, whole or streamed (``ui.api.completions``);
- ``GET /v1/models`` and ``GET /v1/models/<name>``: the model the live workers serve (from their heartbeats);
- ``GET /v1/key``: a key (``ui.api.api_keys``).

They are plain Starlette routes on Gradio's app, behind the same edge middlewares as every other route
(``ui.edge``; ``ui.edge.public_routes`` opens exactly these), and every refusal there is an OpenAI error object too
(``ui.edge.api_refusals``).
"""
from __future__ import annotations

import asyncio
import time

from starlette.responses import JSONResponse
from starlette.routing import Route

from ui.api import responses as shapes
from ui.api.api_keys import ApiKeys
from ui.api.completions import ChatCompletions
from ui.api.errors import ApiError
from ui.identity import ClientAddresses
from ui.shared.route_paths import CHAT_COMPLETIONS_PATH, KEY_PATH, MODELS_PATH


def api_routes(handlers, config, metrics, addresses: ClientAddresses) -> list[Route]:
    """The routes, built from the page's handlers (their client, identity issuer, slots, decode pool, stream reader
    and pacer: the API shares them all)."""
    keys = ApiKeys(handlers.issuer, addresses, tuple(login for login, _ in config.auth))
    completions = ChatCompletions(handlers, keys, metrics)
    started = int(time.time())

    async def models(request):
        try:
            keys.caller(request)
            served = await asyncio.to_thread(handlers.client.served_models)
        except Exception as exc:  # noqa: BLE001 — a refusal, or Redis away
            return completions.refused(exc)
        name = request.path_params.get("name")
        if name is None:
            return JSONResponse(shapes.model_list(served, started))
        if name not in served:
            return ApiError(404, f"The model {name!r} is not served here.", "model_not_found").response()
        return JSONResponse(shapes.model_object(name, started))

    async def key(request):
        try:
            return JSONResponse(keys.issue(request), headers={"Cache-Control": "no-store"})
        except ApiError as exc:
            return exc.response()

    return [Route(CHAT_COMPLETIONS_PATH, completions.handle, methods=["POST"]),
            Route(MODELS_PATH, models, methods=["GET"]),
            Route(MODELS_PATH + "/{name}", models, methods=["GET"]),
            Route(KEY_PATH, key, methods=["GET"])]
