"""Operations endpoints served next to the page: ``/healthz`` and ``/metrics`` (Prometheus text format).

They are plain Starlette routes handed to Gradio's FastAPI app at construction, so they work with
``launch()`` (including ``--share``) and need no second port. Both are private by design:

- ``/metrics`` answers only to ``Authorization: Bearer <OWLET_UI_METRICS_TOKEN>``; with no token configured
  it is off (404). It carries aggregates only: no user, address or worker labels.
- ``/healthz`` tells anyone ``{"ok": true|false}`` (for load balancers and compose), and tells a caller with
  the metrics token why, with worker names.
"""
from __future__ import annotations

import hmac

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

METRICS_OFF = "metrics are off: set OWLET_UI_METRICS_TOKEN and scrape with that bearer token\n"


def authorised(request, token: str) -> bool:
    """True when ``token`` is configured and the request carries it as a bearer token."""
    if not token:
        return False
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def ops_routes(client, metrics, metrics_token: str = "") -> list[Route]:
    """Routes for ``App(routes=...)``; both read Redis in a thread so the event loop never blocks."""

    async def healthz(request):
        try:
            health = await run_in_threadpool(client.health)
        except Exception as exc:  # Redis refusing connections can surface here rather than as redis=False
            health = {"redis": False, "workers": [], "detail": type(exc).__name__}
        workers = [w.get("worker") for w in health.get("workers", [])]
        ok = bool(health.get("redis")) and len(workers) >= 1
        body = {"ok": ok}
        if authorised(request, metrics_token):
            body.update(redis=bool(health.get("redis")), workers=workers, queued=health.get("queued"))
            if not health.get("redis"):
                body["reason"] = "Redis is not reachable"
            elif not workers:
                body["reason"] = "no worker heartbeat is alive"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prometheus(request):
        if not metrics_token:
            return PlainTextResponse(METRICS_OFF, status_code=404)
        if not authorised(request, metrics_token):
            return PlainTextResponse("unauthorised\n", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        payload = await run_in_threadpool(metrics.render)
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])]
