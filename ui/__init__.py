"""Owlet's web page: a Gradio multimodal chat over the worker client, plus /healthz and /metrics.

Nothing here loads a model or talks to an engine directly; every turn, the page's and the OpenAI-compatible API's,
goes through ``worker.client.OwletClient`` (Redis), so the page can run on a machine without a GPU.
Start it with ``python -m ui`` (see ``ui/__main__.py``).

Where things are:

- here: ``__main__`` (the command), ``config`` (its settings), ``identity`` (who asks, in which group, from which
  address), ``app`` (the page's layout and events) and ``server`` (everything wired together and served);
- ``chat/``: the handlers and the answer streams they follow;
- ``uploads/``: an uploaded picture, from Gradio's upload route to a turn;
- ``edge/``: the ASGI middlewares a request meets before Gradio;
- ``gradio_adapters/``: Gradio's internals that Owlet reads or replaces, through one registry checked at start-up;
- ``api/``: the OpenAI-compatible API (``/v1/chat/completions``, ``/v1/models``, ``/v1/key``), on the same parts;
- ``ops/``: starting the server, ``/healthz`` and ``/metrics``, and the log.
"""
