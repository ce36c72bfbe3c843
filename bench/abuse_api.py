"""The abuse benchmark's API scene (``bench/abuse.py``, scene 4): a flood of keys from one address against honest
API users, through the real page's OpenAI-compatible API.

The real page (``python -m ui``) runs in front of the same kind of worker as the other scenes, trusting 127.0.0.1
as its proxy, so each simulated client is the address its ``X-Forwarded-For`` names. One address fetches ``flood``
fresh keys from ``GET /v1/key`` and asks one streamed question with each; then 4 honest users at 4 other addresses,
each with its own key, ask one question each. The page's per-address limits and the queue's caps are raised so the
whole flood is admitted and waits (the worst case for ordering, as in scene 1); the keys are what the page groups by
address. Each answer's queue wait, first token and service time are read from its job's stream (the completion's id
is ``chatcmpl-<job>``), as in the other scenes. Every answer is exactly ``--tokens`` long (vLLM's ``ignore_eos``, which
the API takes), as the other scenes' are.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.page_stream import start_page, wait_healthy
from bench.queue_worker import Workers, job_times, warm_up
from tests.ui.stack import free_port
from worker.client import OwletClient

ATTACKER = "203.0.113.66"
HONEST = tuple(f"198.51.100.{i}" for i in range(1, 5))
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def api_page(client: OwletClient, flood: int, log_dir: Path) -> Iterator[str]:
    """The real page on the worker's namespace, with the same raised caps; yields its base URL."""
    s = client.settings
    room = str(flood + 10)
    env = dict(os.environ, REDIS_URL=s.redis_url, OWLET_KEY_PREFIX=s.key_prefix,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OWLET_USER_QUEUE_CAP=str(s.user_queue_cap), OWLET_GLOBAL_QUEUE_CAP=str(s.global_queue_cap),
               OWLET_GROUP_JOB_CAP=str(s.group_job_cap), OWLET_GROUP_SUBMIT_LIMIT=str(s.group_submit_limit),
               OWLET_UI_TRUSTED_PROXIES="127.0.0.1", OWLET_UI_ADDRESS_MAX_EVENTS=room,
               OWLET_UI_ADDRESS_MAX_CONNECTIONS=room)
    port = free_port()
    page = start_page(env, port, log_dir / "api-page.log")
    try:
        wait_healthy(page, port, log_dir / "api-page.log")
        yield f"http://127.0.0.1:{port}/"
    finally:
        page.terminate()
        page.wait(timeout=20)


class Asker(threading.Thread):
    """One client asking one streamed question with its own key from ``address``; ``admitted`` is set once the page
    answered (200: the turn is queued), and the job's id is read from the first chunk."""

    def __init__(self, base: str, model: str, address: str, tokens: int, label: str):
        super().__init__(daemon=True)
        self.base, self.model, self.address, self.tokens, self.label = base, model, address, tokens, label
        self.admitted = threading.Event()
        self.status = self.job = None
        self.submitted_at = 0.0

    def run(self) -> None:
        try:
            with httpx.Client(timeout=600, headers={"X-Forwarded-For": self.address}) as http:
                key = http.get(self.base + "v1/key").json()["key"]
                body = {"model": self.model, "stream": True, "max_tokens": self.tokens, "ignore_eos": True,
                        "messages": [{"role": "user", "content": f"Question from {self.label}."}]}
                self.submitted_at = time.time()
                with http.stream("POST", self.base + "v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as response:
                    self.status = response.status_code
                    for line in response.iter_lines():
                        if line.startswith("data: {") and self.job is None:
                            self.job = json.loads(line[len("data: "):])["id"].removeprefix("chatcmpl-")
                            self.admitted.set()
        finally:
            self.admitted.set()


def served_model(base: str) -> str:
    key = httpx.get(base + "v1/key").json()["key"]
    return httpx.get(base + "v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]


def api_flood_and_honest(client: OwletClient, base: str, flood: int, tokens: int) -> dict:
    """The flood's keys ask (each admitted before the next asks), then the honest users; figures as scene 1's."""
    model = served_model(base)
    askers = [Asker(base, model, ATTACKER, tokens, f"key {i}") for i in range(flood)]
    askers += [Asker(base, model, address, tokens, f"honest{i + 1}") for i, address in enumerate(HONEST)]
    for asker in askers:
        asker.start()
        asker.admitted.wait(timeout=120)
    for asker in askers:
        asker.join(timeout=600)
    refused = sum(1 for a in askers if a.status != 200 or a.job is None)
    rows = [{"who": a.label, **job_times(client, a.job, a.submitted_at)} for a in askers if a.job]
    attacker = [row for row in rows if row["who"].startswith("key")]
    service = statistics.median(row["service_s"] for row in attacker)
    honest = {row["who"]: row for row in rows if row["who"].startswith("honest")}
    groups = {client.r.hget(client.keys.job(a.job), "group") for a in askers[:flood] if a.job}
    return {"service_s": service, "refused": refused, "attacker_groups": len(groups),
            "wait": {who: row["wait_s"] / service for who, row in honest.items()},
            "first_token": {who: row["first_token_s"] / service for who, row in honest.items()},
            "attacker_wait": statistics.median(row["wait_s"] for row in attacker) / service}


def run_api_flood(workers: Workers, name: str, args, log_dir: Path, sampling) -> dict:
    """Scene 4 on the worker ``workers`` names ``name``, and a fresh page."""
    with workers.use(name) as client:
        warm_up(client, args.slots, sampling(args.tokens))
        with api_page(client, args.flood, log_dir) as base:
            return api_flood_and_honest(client, base, args.flood, args.tokens)
