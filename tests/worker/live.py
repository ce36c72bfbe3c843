"""Helpers shared by the tests that run real Celery workers with the tiny model."""
from __future__ import annotations

import io
import time

from PIL import Image


def png(colour=(200, 30, 30), size=(48, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def collect(client, job_id, timeout_s: float = 60.0) -> list[dict]:
    """All events of a job until its terminal one; fails the test instead of hanging."""
    events, deadline = [], time.monotonic() + timeout_s
    for _, event in client.events(job_id):
        events.append(event)
        assert time.monotonic() < deadline, f"job {job_id} still streaming after {timeout_s}s: {events[-3:]}"
    return events


def types(events) -> list[str]:
    """Event types with runs of tokens collapsed, e.g. ['queued', 'started', 'token', 'done']."""
    out = []
    for e in events:
        if not (out and out[-1] == "token" and e["type"] == "token"):
            out.append(e["type"])
    return out


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
