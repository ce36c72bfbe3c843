"""Soak: the demo stack under a person's pace for N minutes, and whether its memory levels off.

Starts the stack the demo runs (``owlet.demo.Stack``: an embedded Redis, one worker serving the bundled
``models/owlet-shapes-vl``, the real page ``python -m ui``), with the page trusting 127.0.0.1 as its proxy. Each of
``--clients`` simulated people talks through the page's ``/chat`` endpoint (gradio_client), one turn started about
every ``--turn-s`` seconds (or as soon as the last answer ended, if it took longer). Each conversation is a new
visitor: a fresh client address in ``X-Forwarded-For`` (from a pool of ``--addresses``), a fresh Gradio session and
a fresh identity, asking about a new picture and then two follow-ups. So no per-address limit is lifted: each
address asks three questions per conversation, as a person would, and the page's and worker's per-address and
per-visitor structures see as many visitors as a public link would.

Every ``--sample-s`` seconds it reads the page's RSS, the worker's RSS (the worker process and any children), and
Redis's ``used_memory``. Over the last third of the run it fits each one's slope (least squares, MB/min), and
Redis's bytes per answered turn and per new conversation. The worker's RSS is set against its budgets: its RSS
before the first turn (the model, torch, Celery, the engine's preallocations), plus the session store's and the
image features' budgets, plus a stated constant (``WORKER_CONSTANT_MB``). The worker's budgets are set small here
(``--session-mb``, ``--image-mb``) so that its caches fill within the first third: a slope over the last third is
then memory nothing budgets, not a cache filling up to its bound. The slope of the worker's RSS less what its caches
hold (read from its /metrics) is printed too.

    .venv/bin/python -m bench.soak --minutes 30 [--clients 12] [--turn-s 2] [--sample-s 20] [--quick]

``--quick`` runs 3 clients for 30 s, sampling every 3 s. Ends with a table and ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402

# What the worker may hold beyond its RSS before the first turn and its two cache budgets: what first use allocates
# (torch's per-thread buffers, kernels' scratch for each new shape, Celery's threads) and the allocator's slack.
WORKER_CONSTANT_MB = 256.0
MB = 1024 * 1024
QUESTIONS = ("What shape is in the picture?", "What colour is it?", "Where is it in the picture?")
SHAPES = ("ellipse", "rectangle", "triangle")
COLOURS = ((220, 40, 40), (40, 160, 60), (40, 80, 220), (230, 200, 40), (150, 60, 200), (20, 20, 20))


# -- the processes' memory -------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, in MB."""
    total = 0
    for p in (pid, *_children(pid)):
        with contextlib.suppress(OSError):
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
    return total / MB


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return float("nan")
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 60.0


# -- the people ------------------------------------------------------------------------------------------------
def new_picture(path: Path, rng: random.Random) -> Path:
    """A picture no one sent before: one shape of one colour at a random place, on a light background."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (320, 240), tuple(rng.randint(200, 255) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    x, y, size = rng.randint(10, 200), rng.randint(10, 120), rng.randint(40, 100)
    colour, shape = rng.choice(COLOURS), rng.choice(SHAPES)
    if shape == "ellipse":
        draw.ellipse((x, y, x + size, y + size), fill=colour)
    elif shape == "rectangle":
        draw.rectangle((x, y, x + size, y + size * 0.7), fill=colour)
    else:
        draw.polygon(((x, y + size), (x + size, y + size), (x + size / 2, y)), fill=colour)
    for _ in range(200):  # speckle, so each file's bytes differ beyond the shape
        draw.point((rng.randrange(320), rng.randrange(240)), fill=tuple(rng.randrange(256) for _ in range(3)))
    image.save(path)
    return path


class Tally:
    """Turns and conversations, answered and failed, shared by every client thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answered = self.errors = self.conversations = self.empty = 0
        self.answer_chars = self.picture_bytes = self.pictures = 0  # for the Redis model's traffic
        self.error_samples: list[str] = []

    def turn(self, ok: bool, what: str = "", empty: bool = False, answer_chars: int = 0) -> None:
        with self.lock:
            self.empty += empty
            self.answer_chars += answer_chars
            if ok:
                self.answered += 1
            else:
                self.errors += 1
                if len(self.error_samples) < 10:
                    self.error_samples.append(what[:300])

    def snapshot(self) -> tuple[int, int, int]:
        with self.lock:
            return self.answered, self.errors, self.conversations


def person(index: int, url: str, addresses, tally: Tally, stop: threading.Event, turn_s: float,
           max_new_tokens: int, pictures: Path) -> None:
    """One simulated person after another on one client: a new visitor per conversation, three turns each."""
    from gradio_client import Client

    from tests.ui.page_client import bubble_text, submit

    rng = random.Random(index)
    client = Client(url, verbose=False, download_files=False, headers={"X-Forwarded-For": next(addresses)})
    next_start = time.monotonic() + rng.uniform(0, turn_s)
    try:
        while not stop.is_set():
            client.headers["X-Forwarded-For"] = next(addresses)  # a new visitor: new address, tab, identity
            client.reset_session()
            client.owlet_token = None
            with tally.lock:
                tally.conversations += 1
                picture = new_picture(pictures / f"p{index}-{tally.conversations}.png", rng)
                tally.pictures += 1
                tally.picture_bytes += picture.stat().st_size
            for turn, question in enumerate(QUESTIONS):
                wait = next_start - time.monotonic()
                if stop.wait(max(0.0, wait)):
                    break
                next_start = max(time.monotonic(), next_start) + turn_s * rng.uniform(0.8, 1.2)
                try:
                    final = submit(client, question, picture if turn == 0 else None, max_new_tokens).result(
                        timeout=300)
                    chat = next((v for v in final if isinstance(v, list)), None)  # (box, chat, status)
                    status = final[-1]
                    answer = bubble_text(chat[-1]) if chat and chat[-1].get("role") == "assistant" else ""
                    # Answered: the page says so under the answer. The bundled model may end at once (an empty
                    # answer is what it said, not a lost turn): counted apart.
                    ok = isinstance(status, str) and status.startswith("Answered")
                    tally.turn(ok, f"status {status!r}, answer {answer!r}", empty=ok and not answer.strip(),
                               answer_chars=len(answer) if ok else 0)
                except Exception as exc:  # a refused or failed turn is counted and shown, never hidden
                    tally.turn(False, f"{type(exc).__name__}: {exc}")
            picture.unlink(missing_ok=True)
    finally:
        with contextlib.suppress(Exception):
            client.close()


def address_pool(size: int):
    """Client addresses from 10.48.0.0/16 (a private range), reused round-robin (thread-safe)."""
    base = int(ipaddress.ip_address("10.48.0.1"))
    cycle = itertools.cycle(str(ipaddress.ip_address(base + i)) for i in range(size))
    lock = threading.Lock()

    class Pool:
        def __next__(self):
            with lock:
                return next(cycle)

    return Pool()


def worker_caches_mb(port: int) -> dict:
    """What the worker's session store and image feature cache hold now, from its /metrics (MB)."""
    import urllib.request

    from owlet.demo import DIRECT

    held = {"sessions_mb": float("nan"), "images_mb": float("nan")}
    with contextlib.suppress(OSError):
        with DIRECT.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                for stat, name in (('stat="session_bytes"', "sessions_mb"), ('stat="image_bytes"', "images_mb")):
                    if line.startswith("owlet_worker_cache{") and stat in line:
                        held[name] = float(line.rsplit(" ", 1)[1]) / MB
    return held


# -- the run ---------------------------------------------------------------------------------------------------
def worker_budgets_mb(env: dict, start_mb: float) -> dict:
    """The worker's configured memory budgets on CPU, as its engine would resolve them (docs/configuration.md),
    over its RSS before the first turn."""
    from engine.config import EngineConfig

    config = EngineConfig.from_env(env)
    session = config.session_budget_mb if config.session_budget_mb is not None else 256.0
    return {"start_mb": start_mb, "session_mb": session, "image_mb": config.image_cache_mb,
            "constant_mb": WORKER_CONSTANT_MB,
            "total_mb": start_mb + session + config.image_cache_mb + WORKER_CONSTANT_MB}


def run(args) -> dict:
    import redis
    import torch

    from owlet.demo import DEFAULT_MODEL, Stack, _free_port

    log_dir = ROOT / "artifacts" / "soak-logs"
    metrics_port = _free_port()  # the worker's /metrics: what its session store and image cache hold
    extra_env = {"OWLET_UI_TRUSTED_PROXIES": "127.0.0.1", "OWLET_MODEL": str(DEFAULT_MODEL),
                 "OWLET_WORKER_METRICS_PORT": str(metrics_port), "OWLET_SESSION_BUDGET_MB": str(args.session_mb),
                 "OWLET_IMAGE_CACHE_MB": str(args.image_mb)}
    extra_env.update(dict(item.split("=", 1) for item in args.env))
    if args.probe or args.tracemalloc:  # bench/memory_probe/sitecustomize.py in every Python child
        probe_dir = log_dir / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        extra_env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "bench" / "memory_probe"), str(ROOT)]),
                         OWLET_SOAK_PROBE_DIR=str(probe_dir), OWLET_SOAK_PROBE_S=str(args.sample_s),
                         OWLET_SOAK_TRACEMALLOC="1" if args.tracemalloc else "0")
        print(f"probe: each process writes its heap figures to {probe_dir}", flush=True)
    samples: list[dict] = []
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="owlet-soak-") as tmp:
        from engine.config import max_active_from_env

        stack = Stack(None, str(DEFAULT_MODEL), "127.0.0.1", _free_port(), [],
                      max_active_from_env({**os.environ, **extra_env}) + 2, log_dir=log_dir, extra_env=extra_env,
                      uploads_dir=Path(tmp) / "uploads")
        with stack:
            stack.wait_ready(300)
            r = redis.Redis.from_url(stack.redis_url)
            worker_pid, page_pid = stack.children["worker"].pid, stack.children["ui"].pid
            pictures = Path(tmp) / "pictures"
            pictures.mkdir()
            stop = threading.Event()
            addresses = address_pool(args.addresses)
            people = [threading.Thread(target=person, daemon=True, args=(
                i, stack.url, addresses, tally, stop, args.turn_s, args.max_new_tokens, pictures))
                for i in range(args.clients)]
            start = time.monotonic()

            def sample() -> None:
                answered, errors, conversations = tally.snapshot()
                samples.append({"t": time.monotonic() - start, "page_mb": rss_mb(page_pid),
                                "worker_mb": rss_mb(worker_pid), **worker_caches_mb(metrics_port),
                                "redis_bytes": int(r.info("memory")["used_memory"]),
                                "answered": answered, "errors": errors, "conversations": conversations})
                s = samples[-1]
                print(f"  {s['t'] / 60:5.1f} min  page {s['page_mb']:7.1f} MB  worker {s['worker_mb']:7.1f} MB  "
                      f"(sessions {s['sessions_mb']:.1f}, images {s['images_mb']:.1f})  "
                      f"redis {s['redis_bytes'] / MB:6.2f} MB  turns {answered}  errors {errors}", flush=True)

            sample()
            budgets = worker_budgets_mb({**os.environ, **extra_env}, samples[0]["worker_mb"])
            for p in people:
                p.start()
            end = start + args.minutes * 60
            while time.monotonic() < end:
                stack.check_children()
                time.sleep(max(0.0, min(args.sample_s - (time.monotonic() - start - samples[-1]["t"]),
                                        end - time.monotonic())))
                sample()
            stop.set()
            for p in people:
                p.join(timeout=330)
            token_events = token_events_per_answer(r)
            r.close()
    return summarize(args, samples, tally, budgets, torch.get_num_threads(), token_events)


def token_events_per_answer(r, most: int = 200) -> float:
    """The mean number of token events in the answer streams Redis holds now (up to ``most`` of them): each stream
    has a queued, a started and a terminal event besides its coalesced token events."""
    lengths = []
    for key in r.scan_iter(match="*stream:*", count=500):
        if r.type(key) == b"stream":
            lengths.append(max(0, r.xlen(key) - 3))
            if len(lengths) >= most:
                break
    return sum(lengths) / len(lengths) if lengths else float("nan")


def redis_model_mb_per_min(tally: Tally, samples: list[dict], token_events: float) -> dict:
    """What docs/redis_memory.md's model (worker.store.memory_model) says Redis grows by at the traffic this run had:
    its history, pictures and jobs, plus the quota keys of one new identity and address per conversation (every
    conversation here is a new visitor)."""
    from worker.config import Settings
    from worker.store.memory_model import ADDRESS_BYTES, IDENTITY_BYTES, Traffic, redis_growth_bytes_per_s

    duration = samples[-1]["t"]
    answered, _, conversations = tally.snapshot()
    if not (duration and answered and conversations and tally.pictures):
        return {"redis_model_mb_per_min": float("nan")}
    per_day = 86400 / duration
    turns = answered / conversations
    traffic = Traffic(conversations_per_day=conversations * per_day, turns_per_conversation=turns,
                      question_chars=sum(map(len, QUESTIONS)) / len(QUESTIONS),
                      answer_chars=tally.answer_chars / answered, pictures_per_day=tally.pictures * per_day,
                      picture_bytes=int(tally.picture_bytes / tally.pictures),
                      token_events_per_answer=token_events if token_events == token_events else 30)
    settings = Settings.from_env()
    parts = redis_growth_bytes_per_s(traffic, duration, settings.history_ttl_s, settings.image_ttl_s,
                                     settings.stream_ttl_s)
    ledgers = conversations / duration * (IDENTITY_BYTES + ADDRESS_BYTES)
    return {"redis_model_mb_per_min": (parts["total"] + ledgers) * 60 / MB,
            "redis_model_parts_mb_per_min": {**{k: v * 60 / MB for k, v in parts.items() if k != "total"},
                                             "ledgers": ledgers * 60 / MB},
            "redis_model_traffic": {"turns_per_conversation": round(turns, 2),
                                    "answer_chars": round(traffic.answer_chars, 1),
                                    "picture_bytes": traffic.picture_bytes,
                                    "token_events_per_answer": round(traffic.token_events_per_answer, 1)}}


def summarize(args, samples: list[dict], tally: Tally, budgets: dict, threads: int,
              token_events: float = float("nan")) -> dict:
    duration = samples[-1]["t"]
    tail = [s for s in samples if s["t"] >= duration * 2 / 3]
    first, last = tail[0], tail[-1]
    turns = last["answered"] - first["answered"]
    conversations = last["conversations"] - first["conversations"]
    redis_growth = last["redis_bytes"] - first["redis_bytes"]
    answered, errors, conversations_all = tally.snapshot()
    model = redis_model_mb_per_min(tally, samples, token_events)
    redis_slope = slope_per_min([(s["t"], s["redis_bytes"] / MB) for s in tail])
    return {
        **model, "redis_over_model": redis_slope / model["redis_model_mb_per_min"]
        if model["redis_model_mb_per_min"] else float("nan"),
        "minutes": args.minutes, "clients": args.clients, "samples": len(samples), "tail_samples": len(tail),
        "turns_answered": answered, "errors": errors, "conversations": conversations_all,
        "empty_answers": tally.empty,
        "all_answered": answered > 0 and errors == 0, "sampled_throughout": len(samples) >= 4 and len(tail) >= 2,
        "error_samples": tally.error_samples,
        "page_mb_start": samples[0]["page_mb"], "page_mb_end": last["page_mb"],
        "page_mb_per_min": slope_per_min([(s["t"], s["page_mb"]) for s in tail]),
        "worker_mb_start": samples[0]["worker_mb"], "worker_mb_end": last["worker_mb"],
        "worker_mb_max": max(s["worker_mb"] for s in samples),
        "worker_sessions_mb_end": last["sessions_mb"], "worker_images_mb_end": last["images_mb"],
        "worker_mb_per_min": slope_per_min([(s["t"], s["worker_mb"]) for s in tail]),
        "worker_beyond_caches_mb_per_min": slope_per_min(
            [(s["t"], s["worker_mb"] - s["sessions_mb"] - s["images_mb"]) for s in tail]),
        "worker_budget_mb": budgets["total_mb"], "worker_budgets": budgets,
        "worker_within_budget": max(s["worker_mb"] for s in samples) <= budgets["total_mb"],
        "redis_mb_start": samples[0]["redis_bytes"] / MB, "redis_mb_end": last["redis_bytes"] / MB,
        "redis_mb_per_min": redis_slope,
        "redis_bytes_per_turn": redis_growth / turns if turns else float("nan"),
        "redis_bytes_per_conversation": redis_growth / conversations if conversations else float("nan"),
        "turns_per_min": answered / (duration / 60) if duration else float("nan"),
        "sample_times_s": [round(s["t"], 1) for s in samples],
        "page_mb": [round(s["page_mb"], 1) for s in samples],
        "worker_mb": [round(s["worker_mb"], 1) for s in samples],
        "redis_mb": [round(s["redis_bytes"] / MB, 2) for s in samples],
        "machine": f"{cpu_description()}, torch threads {threads}, dtype float32 (the bundled model on CPU)",
    }


def print_table(result: dict) -> None:
    print(f"\nmachine: {result['machine']}")
    print(f"{result['clients']} clients, {result['minutes']} min: {result['turns_answered']} turns answered "
          f"({result['turns_per_min']:.0f}/min; {result['empty_answers']} of them empty: the model ended at once), "
          f"{result['conversations']} conversations, {result['errors']} errors")
    for sample in result["error_samples"]:
        print(f"  error: {sample}")
    print("\n| | start | end | slope over the last third | target |")
    print("|---|---|---|---|---|")
    print(f"| page RSS | {result['page_mb_start']:.0f} MB | {result['page_mb_end']:.0f} MB | "
          f"{result['page_mb_per_min']:+.2f} MB/min | <= 0.5 MB/min |")
    print(f"| worker RSS | {result['worker_mb_start']:.0f} MB | {result['worker_mb_end']:.0f} MB | "
          f"{result['worker_mb_per_min']:+.2f} MB/min | <= 0.5 MB/min; max {result['worker_mb_max']:.0f} MB <= "
          f"budgets {result['worker_budget_mb']:.0f} MB |")
    print(f"| worker RSS less its caches | | | {result['worker_beyond_caches_mb_per_min']:+.2f} MB/min | "
          f"sessions {result['worker_sessions_mb_end']:.1f} MB, images {result['worker_images_mb_end']:.1f} MB "
          f"held at the end |")
    print(f"| Redis used_memory | {result['redis_mb_start']:.1f} MB | {result['redis_mb_end']:.1f} MB | "
          f"{result['redis_mb_per_min']:+.2f} MB/min | {result['redis_bytes_per_turn']:.0f} B/turn, "
          f"{result['redis_bytes_per_conversation']:.0f} B/conversation |")
    print(f"| Redis, docs/redis_memory.md's model at this traffic | | | "
          f"{result['redis_model_mb_per_min']:+.2f} MB/min | measured / model "
          f"{result['redis_over_model']:.2f} |")
    if "redis_model_parts_mb_per_min" in result:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in result["redis_model_parts_mb_per_min"].items())
        print(f"\nRedis model, MB/min: {parts}; traffic {result['redis_model_traffic']}")
    b = result["worker_budgets"]
    print(f"\nworker budgets: RSS before the first turn {b['start_mb']:.0f} MB + sessions {b['session_mb']:.0f} MB"
          f" + image features {b['image_mb']:.0f} MB + constant "
          f"{b['constant_mb']:.0f} MB = {b['total_mb']:.0f} MB")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--turn-s", type=float, default=2.0, help="seconds between one client's turns (about)")
    ap.add_argument("--sample-s", type=float, default=20.0)
    ap.add_argument("--addresses", type=int, default=4096, help="client addresses the visitors come from")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--session-mb", type=float, default=64.0, help="the worker's session store budget")
    ap.add_argument("--image-mb", type=float, default=16.0, help="the worker's image feature cache budget")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for the worker and page (repeatable), e.g. MALLOC_ARENA_MAX=2")
    ap.add_argument("--probe", action="store_true", help="each process logs its Python heap and allocator figures "
                    "(bench/memory_probe) to artifacts/soak-logs/probe")
    ap.add_argument("--tracemalloc", action="store_true", help="--probe, plus the source lines that grew (slow)")
    add_quick_flag(ap)
    args = parse_with_quick(ap, argv, {"minutes": 0.5, "clients": 3, "sample_s": 3.0})
    print(f"soak: {args.clients} clients, a turn every ~{args.turn_s} s each, {args.minutes} min, sampling every "
          f"{args.sample_s} s", flush=True)
    result = run(args)
    print_table(result)
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
