"""Owlet's web page: a Gradio multimodal chat over the worker client, plus /healthz and /metrics.

Nothing here loads a model or talks to an engine directly; every turn, the page's and the OpenAI-compatible API's,
goes through ``worker.client.OwletClient`` (Redis), so the page can run on a machine without a GPU.
Start it with ``python -m ui`` (see ``ui/__main__.py``).

Where things are:

- here: ``__main__`` (the command), ``config`` (its settings), ``identity`` (who asks, in which group, from which
  address), ``app`` (the page's layout and events) and ``server`` (everything wired together and served);
- ``shared/``: the lowest layer: every sentence the page shows, one shape for a refusal, per-address slots, the
  OpenAI error object, route paths, the log budget;
- ``uploads/``: an uploaded picture, from Gradio's upload route to a turn;
- ``gradio_adapters/``: Gradio's internals that Owlet reads or replaces, through one registry checked at start-up;
- ``edge/``: the ASGI middlewares a request meets before Gradio;
- ``chat/``: asking a turn, streaming its answer, the tab's session;
- ``api/``: the OpenAI-compatible API (``/v1/chat/completions``, ``/v1/models``, ``/v1/key``), on the same parts;
- ``ops/``: starting the server, ``/healthz`` and ``/metrics``.

Each group imports only the groups listed before it (and ``identity`` and ``config``, which import only
``shared/``); tests/ui/test_layers.py checks it, and docs/design.md draws the layers.
"""
