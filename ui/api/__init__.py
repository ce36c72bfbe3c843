"""The OpenAI-compatible API, served by the page process: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET
/v1/key``.

One more client of the queue, on the page's own parts: its identities (``api_keys``), its edge, per-address slots and
decode pool, the worker client's atomic admission and the page's one stream reader. ``routes`` wires the routes,
``completions`` runs one request, ``chat_request`` reads its body, ``bodies`` bounds the large ones read at once,
``responses`` builds what is sent back, and ``errors`` says every refusal as an OpenAI error object.
"""
