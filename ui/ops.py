"""Operations endpoints served next to the page: ``/healthz`` and ``/metrics`` (Prometheus text format).

They are plain Starlette routes handed to Gradio's FastAPI app at construction, so they work with
``launch()`` (including ``--share``) and need no second port.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def ops_routes(client, metrics) -> list[Route]:
    """Routes for ``App(routes=...)``; both read Redis in a thread so the event loop never blocks."""

    async def healthz(_request):
        try:
            health = await run_in_threadpool(client.health)
        except Exception as exc:  # Redis refusing connections can surface here rather than as redis=False
            health = {"redis": False, "workers": [], "detail": type(exc).__name__}
        workers = [w.get("worker") for w in health.get("workers", [])]
        ok = bool(health.get("redis")) and len(workers) >= 1
        body = {"ok": ok, "redis": bool(health.get("redis")), "workers": workers,
                "queued": health.get("queued")}
        if not health.get("redis"):
            body["reason"] = "Redis is not reachable"
        elif not workers:
            body["reason"] = "no worker heartbeat is alive"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prometheus(_request):
        payload = await run_in_threadpool(metrics.render)
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])]
