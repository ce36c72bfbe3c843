"""The simulated users of ``bench.page_stream``: N ``gradio_client`` users in a process of their own.

    python -m bench.page_users --url URL --page-pid PID --users N --tokens T --short-turns S --image PNG [--idle-s I]

Phase 1 (short turns): every user asks S questions one after another, the first with an image, each answered in
2 tokens. Phase 2 (streams): all users, each with that conversation on screen, ask at the same moment for an
answer of T tokens. The page process's CPU time is read from ``/proc/PID/stat`` at each phase's edges.

The stub engine writes each token as the millisecond it was emitted, so every token's latency (emitted -> seen
here) is read off the answer text. gradio_client's stream thread sleeps 50 ms whenever it finds no message;
that sleep is shortened to 20 ms here, so the latency measured is the page's, not the client's poll.
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gradio_client.client as gc_client  # noqa: E402
import httpx._transports.default as httpx_transport  # noqa: E402
import gradio_client.utils as gc_utils  # noqa: E402
from gradio_client import Client  # noqa: E402

from tests.ui.page_client import bubble_text, submit  # noqa: E402
from ui.shared import wording  # noqa: E402

CLIENT_POLL_S = 0.02
WATCH_POLL_S = 0.002


class _ShortSleeps:
    """``time`` for gradio_client's stream loop, with its idle sleeps capped at CLIENT_POLL_S."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, CLIENT_POLL_S))


class _WireCounter:
    """``json`` for gradio_client's SSE reader: counts the bytes of each streamed update it parses."""

    def __init__(self):
        self.update_bytes: list[int] = []

    def __getattr__(self, name):
        return getattr(json, name)

    def loads(self, text, *args, **kwargs):
        message = json.loads(text, *args, **kwargs)
        if isinstance(message, dict) and message.get("msg") == "process_generating":
            self.update_bytes.append(len(text))
        return message


def share_one_ssl_context() -> None:
    """gradio_client opens a new httpx client for every stream, and each builds a fresh SSL context (loading
    the CA bundle: about 10 ms of CPU) even for plain http. 64 users do that at the moment their answers
    start, which starved the page and the stub worker of CPU on a 2-core machine. The page is plain HTTP,
    so one shared context changes nothing but this process's own cost."""
    context = httpx_transport.create_ssl_context()
    httpx_transport.create_ssl_context = lambda *args, **kwargs: context


def page_cpu_s(pid: int) -> float:
    """utime + stime of the page process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def chat_of(output) -> list | None:
    """The Chatbot's value in one streamed output tuple (the other outputs are the box and status line)."""
    for value in output if isinstance(output, (list, tuple)) else (output,):
        if isinstance(value, list):
            return value
    return None


def answer_of(output) -> str | None:
    """The answer's text so far; "" while the bubble still says where the question waits (its numbers, "3rd in
    line, about 4 s", are not tokens)."""
    chat = chat_of(output)
    if not chat or chat[-1].get("role") != "assistant":
        return None
    text = bubble_text(chat[-1])
    return "" if text.startswith(wording.WAITING_MARK) else text


def short_turns(client: Client, n: int, image: str) -> None:
    for i in range(n):
        job = submit(client, f"short question {i}", image if i == 0 else None, 2)
        final = job.result(timeout=120)
        assert answer_of(final) is not None, f"no answer in {final!r}"


class StreamWatch:
    """Timestamps every update of every user's job from one thread (no busy thread per user)."""

    def __init__(self, jobs: list):
        self.jobs = jobs
        self.arrivals: list[list[tuple[float, object]]] = [[] for _ in jobs]

    def run(self) -> None:
        seen = [0] * len(self.jobs)
        while True:
            now = time.time()
            live = False
            for i, job in enumerate(self.jobs):
                outputs = job.communicator.job.outputs
                while seen[i] < len(outputs):
                    self.arrivals[i].append((now, outputs[seen[i]]))
                    seen[i] += 1
                live = live or not job.done()
            if not live:
                return
            time.sleep(WATCH_POLL_S)


def stream_stats(arrivals: list[tuple[float, object]], final) -> dict:
    """Per user: updates, updates/s while tokens flowed, token latencies, and the final answer."""
    latencies, shown, token_times = [], 0, []
    for at, output in arrivals:
        text = answer_of(output) or ""
        tokens = [t for t in text.split() if t.isdigit()]
        for token in tokens[shown:]:
            latencies.append(at * 1000 - int(token))
        if len(tokens) > shown:
            token_times.append(at)
        shown = max(shown, len(tokens))
    span = token_times[-1] - token_times[0] if len(token_times) > 1 else 0.0
    rate = (len(token_times) - 1) / span if span > 0 else 0.0
    return {"updates": len(arrivals), "token_updates": len(token_times), "updates_per_s": rate,
            "latencies_ms": latencies, "final": answer_of(final), "tokens_seen": shown}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--page-pid", type=int, required=True)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--short-turns", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=2.0, help="how long the page's idle cost is measured")
    ap.add_argument("--image", required=True)
    args = ap.parse_args()
    gc_utils.time = _ShortSleeps()
    share_one_ssl_context()
    wire = _WireCounter()
    gc_client.json = wire

    with ThreadPoolExecutor(args.users) as pool:
        clients = list(pool.map(lambda _: Client(args.url, verbose=False, download_files=False),
                                range(args.users)))
        print("IDLE", flush=True)  # the bench may start its profiler now
        idle0, i0 = page_cpu_s(args.page_pid), time.monotonic()
        time.sleep(args.idle_s)  # the page's own background cost, with every user connected and idle
        idle_cores = (page_cpu_s(args.page_pid) - idle0) / (time.monotonic() - i0)
        print("SHORT", flush=True)  # the bench may start its profiler now
        cpu0, t0 = page_cpu_s(args.page_pid), time.monotonic()
        list(pool.map(lambda c: short_turns(c, args.short_turns, args.image), clients))
        cpu1, t1 = page_cpu_s(args.page_pid), time.monotonic()
        time.sleep(0.5)  # let the last turns' follow-up events settle before the streams start
        wire.update_bytes.clear()
        print("STREAMS", flush=True)  # the bench may start its profiler now
        cpu2, t2 = page_cpu_s(args.page_pid), time.monotonic()
        jobs = [submit(c, "tell me a long story", None, args.tokens) for c in clients]
        watch = StreamWatch(jobs)
        watcher = threading.Thread(target=watch.run, daemon=True)
        watcher.start()
        finals = [job.result(timeout=600) for job in jobs]
        watcher.join(timeout=60)
        cpu3, t3 = page_cpu_s(args.page_pid), time.monotonic()
        # Each close waits up to 1 s for the client's heartbeat stream to end: all at once, not N seconds.
        list(pool.map(Client.close, clients))
    users = [stream_stats(a, f) for a, f in zip(watch.arrivals, finals)]
    print(json.dumps({
        "idle_cores": idle_cores,
        "short": {"turns": args.users * args.short_turns, "cpu_s": cpu1 - cpu0, "wall_s": t1 - t0},
        "stream": {"cpu_s": cpu3 - cpu2, "wall_s": t3 - t2, "users": users,
                   "update_bytes": wire.update_bytes},
    }))


if __name__ == "__main__":
    main()
