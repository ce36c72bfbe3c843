"""The stack-ceiling benchmark's load: N clients in this process, each looping one turn after another.

Run by ``bench/stack_ceiling.py`` in a process of its own, so the clients' CPU is not the worker's. Each client is
its own visitor (its own identity and client group) and asks a new conversation's first question, waits for the
whole answer, and asks again at once. Two ways in:

- ``queue``: ``worker.client.OwletClient`` straight into the fair queue (submit, dispatch pass, stream read), each
  client reading its own answer's stream;
- ``hub``: the same submits, the answers read as the page reads them: one ``ui.chat.stream_hub.StreamHub`` for all
  clients (one read of every live stream a tick, waiting answers' places polled at once, starts announced);
- ``page``: the page's OpenAI-compatible API (``POST /v1/chat/completions``, streamed), each client with its own key
  and its own address (``X-Forwarded-For``, the page trusting 127.0.0.1 as its proxy).

It prints ``WINDOW_START`` when the measured window opens and ``WINDOW_END`` when it closes (the parent reads the
worker's and the page's CPU at those lines), then one JSON line: every turn's submit time, time to first token,
end time, tokens and error, for the parent to cut to the window.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path

# The source tree whose client (and page reader) this load drives: this checkout, or another revision a benchmark
# puts beside it (OWLET_BENCH_TREE).
sys.path.insert(0, os.environ.get("OWLET_BENCH_TREE") or str(Path(__file__).resolve().parents[1]))

from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402

QUESTION = "Say something."


def timed_turn(submit, events) -> dict:
    """One turn: ``submit()`` sends the question and returns its job id, ``events(job)`` yields its stream's events
    (the client's own reader, or the page's hub); times are wall-clock seconds."""
    t0 = time.time()
    first, words, error, marks = None, 0, None, {}
    job = submit()
    for event in events(job):
        marks.setdefault(event["type"], event.get("t"))  # the worker's clock at started, first token, done
        if event["type"] == "token":
            if first is None:
                first = time.time()
            words += len(event["text"].split())
        elif event["type"] in ("error", "cancelled"):
            error = event.get("message") or event["type"]
    return {"t0": t0, "first": first, "end": time.time(), "tokens": words, "error": error, "marks": marks, "job": job}


def queue_turn(client: OwletClient, who: str, tokens: int) -> dict:
    """One turn through the fair queue, read by the client's own stream reader."""
    sampling = {"max_new_tokens": tokens, "ignore_eos": True}
    turn = timed_turn(lambda: client.submit(who, None, QUESTION, sampling=sampling).job,
                      lambda job: (event for _, event in client.events(job)))
    job = turn.pop("job")
    dispatched = client.r.hget(client.keys.job(job), "dispatched_at")
    turn["marks"]["dispatched"] = float(dispatched) if dispatched else None
    return turn


class HubReader:
    """The page's one stream reader, run on an event loop of its own, for every client thread of this process."""

    def __init__(self, client: OwletClient):
        from ui.chat.stream_hub import StreamHub

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="hub-loop", daemon=True).start()
        self.hub = asyncio.run_coroutine_threadsafe(self._make(StreamHub, client), self.loop).result()
        # a revision whose SUBMIT takes no notice stream: its hub finds starts by reading every stream
        self.notify = ({"notify": self.hub.started_key}
                       if "notify" in inspect.signature(client.submit).parameters else {})

    @staticmethod
    async def _make(hub_class, client):
        return hub_class(client)

    def events(self, job: str):
        """The job's events as the hub delivers them, until its terminal event."""
        inbox: queue.Queue = queue.Queue()

        async def subscribe():
            return self.hub.subscribe(job, lambda events, ended: inbox.put((events, ended)))

        sub = asyncio.run_coroutine_threadsafe(subscribe(), self.loop).result()
        try:
            while True:
                events, ended = inbox.get(timeout=120)
                yield from events
                if ended:
                    return
        finally:
            self.loop.call_soon_threadsafe(self.hub.unsubscribe, sub)


def hub_turn(client: OwletClient, reader: HubReader, who: str, tokens: int) -> dict:
    """One turn through the fair queue, read through the page's stream reader."""
    sampling = {"max_new_tokens": tokens, "ignore_eos": True}
    turn = timed_turn(lambda: client.submit(who, None, QUESTION, sampling=sampling, **reader.notify).job,
                      reader.events)
    del turn["job"]
    return turn


class PageAsker:
    """One visitor of the page's API: its own address and key, one streamed completion per turn."""

    def __init__(self, base: str, address: str, image: bytes | None = None):
        import base64

        import httpx

        self.base = base
        self.picture = (f"data:image/png;base64,{base64.b64encode(image).decode()}" if image else None)
        self.http = httpx.Client(timeout=120, headers={"X-Forwarded-For": address})
        key = self.http.get(base + "v1/key").json()["key"]
        self.http.headers["Authorization"] = f"Bearer {key}"
        served = self.http.get(base + "v1/models").json()["data"]
        self.model = served[0]["id"] if served else "stub"  # a worker without a checkpoint (the stub) serves any name

    def turn(self, tokens: int) -> dict:
        content = QUESTION if self.picture is None else [
            {"type": "image_url", "image_url": {"url": self.picture}}, {"type": "text", "text": QUESTION}]
        body = {"model": self.model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": content}]}
        t0 = time.time()
        first, words, error, usage = None, 0, None, None
        with self.http.stream("POST", self.base + "v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return {"t0": t0, "first": None, "end": time.time(), "tokens": 0,
                        "error": f"HTTP {response.status_code}: {response.read()[:200]!r}"}
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    error = str(chunk["error"])
                    continue
                if chunk.get("usage"):  # the last chunk: the answer's length in the model's tokens
                    usage = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                text = (chunk["choices"][0].get("delta") or {}).get("content") or ""
                if text:
                    if first is None:
                        first = time.time()
                    words += len(text.split())
        return {"t0": t0, "first": first, "end": time.time(), "tokens": words if usage is None else usage,
                "error": error}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--via", choices=("queue", "hub", "page"), default="queue")
    ap.add_argument("--page-url", help="the page's base URL (--via page)")
    ap.add_argument("--clients", type=int, default=72)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warm-s", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--label", default="c")
    ap.add_argument("--image", type=Path, help="a PNG each turn asks about (--via page): image turns")
    args = ap.parse_args(argv)
    client = OwletClient(settings=Settings.from_env()) if args.via in ("queue", "hub") else None
    reader = HubReader(client) if args.via == "hub" else None
    turns: list[dict] = []
    lock = threading.Lock()
    stop_at = time.time() + args.warm_s + args.seconds + 3600  # replaced once the window is set
    ready = threading.Barrier(args.clients + 1)

    def loop(i: int) -> None:
        who = f"{args.label}{i}"
        try:
            asker = (PageAsker(args.page_url, f"10.{i // 250}.{i % 250}.1",
                               args.image.read_bytes() if args.image else None) if args.via == "page" else None)
        finally:
            ready.wait()  # even when the set-up failed: the others must not wait for this one for ever
        while time.time() < stop_at:
            try:
                if asker:
                    turn = asker.turn(args.tokens)
                elif reader:
                    turn = hub_turn(client, reader, who, args.tokens)
                else:
                    turn = queue_turn(client, who, args.tokens)
            except Exception as exc:  # a refusal or a broken stream is an error of the run, counted, not fatal
                turn = {"t0": time.time(), "first": None, "end": time.time(), "tokens": 0,
                        "error": f"{type(exc).__name__}: {exc}"}
                time.sleep(0.05)
            with lock:
                turns.append(turn)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(args.clients)]
    for t in threads:
        t.start()
    ready.wait()
    start = time.time()
    window = (start + args.warm_s, start + args.warm_s + args.seconds)
    stop_at = window[1]
    time.sleep(max(0.0, window[0] - time.time()))
    print("WINDOW_START", flush=True)
    time.sleep(max(0.0, window[1] - time.time()))
    print("WINDOW_END", flush=True)
    for t in threads:
        t.join(timeout=120)
    with lock:
        print(json.dumps({"window": window, "turns": turns, "hung": sum(t.is_alive() for t in threads)}), flush=True)


if __name__ == "__main__":
    main()
