"""Owlet's web page: a Gradio multimodal chat over the worker client, plus /healthz and /metrics.

Nothing here loads a model or talks to an engine directly; every turn goes through
``worker.client.OwletClient`` (Redis), so the page can run on a machine without a GPU.
Start it with ``python -m ui`` (see ``ui/__main__.py``).
"""
