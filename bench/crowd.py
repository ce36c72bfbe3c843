"""A crowd through a front: N visitors, each its own person at its own address, and one hostile visitor, on the
demo's stack as it ships (the bundled model, the demo's settings).

    .venv/bin/python -m bench.crowd [--front share|proxy] [--visitors 64] [--turns 3] [--quick]

The demo (``owlet.demo.Stack``: its own Redis, one worker serving ``models/owlet-shapes-vl`` with the demo's
defaults, the page) runs with ``--share`` (front ``share``) or behind a trusted proxy at 127.0.0.1 (front ``proxy``,
``OWLET_UI_TRUSTED_PROXIES=127.0.0.1``). Visitors come the way that front delivers them: from loopback, with
``X-Forwarded-For`` naming the visitor after an address the visitor made up (frp's server and a reverse proxy both
append what they saw). Offline, Gradio's share server cannot be reached and the page serves locally; what
``--share`` changes in the page (which front it believes) is the same.

Each visitor is a ``gradio_client`` user with a picture of the bundled model's kind (a held-out shape scene,
``training.examples.eval_dialogue``) and a K-turn conversation about it, at a person's pace: arrivals spread over
``--arrive-s``, and a think of ``--think-s`` (uniform, from half to the whole) between an answer and the next
question. One hostile visitor, at one address of its own, loops with ``--hostile-loops`` clients: each opens a new
tab and mints a new identity for every question (with a picture), and asks again the moment it is answered or
refused.

Printed: the honest turns answered right, refused, failed; their time to first token as the client sees it, p50 and
p95; and each honest turn's queue wait (its job's queued -> started events, read from Redis) over the median
service time of all jobs (started -> done): the worst is the figure to read. Ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.page_users import share_one_ssl_context  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402

HOSTILE = "203.0.113.66"
POLL_S = 0.05  # how often a visitor looks at its answer for the first token
HOSTILE_PAUSE_S = 0.1
ANSWER_TOKENS = 32  # training.eval's length: the longest canonical answer is ~20 tokens
TARGETS = {"refused": 0, "failed": 0, "accuracy": 0.98, "honest_worst_wait_over_service": 2.0}


def visitor_address(i: int) -> str:
    """Visitor i's address: distinct, public-looking (198.18.0.0/15 is for benchmarks, RFC 2544)."""
    return f"198.18.{i // 250}.{i % 250 + 1}"


@dataclass
class Turn:
    visitor: int
    question: str
    expected: str
    answer: str = ""
    status: str = ""
    outcome: str = ""  # right, wrong, refused, failed
    first_token_s: float | None = None


@dataclass
class Hostile:
    asked: int = 0
    answered: int = 0
    refused: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def client_for(url: str, address: str):
    """A gradio_client user the front delivers as ``address`` (after a made-up hop of the visitor's own)."""
    from gradio_client import Client

    forged = f"10.{random.randrange(256)}.{random.randrange(256)}.{random.randrange(1, 255)}"
    return Client(url, verbose=False, headers={"X-Forwarded-For": f"{forged}, {address}"})


def run_turn(client, token: str, text: str, picture: str | None, turn: Turn) -> None:
    """Ask one question and follow it to its end: first token seen, final answer, how it ended."""
    from gradio_client import handle_file

    from tests.ui.page_client import bubble_text
    from ui.chat import wording

    files = [handle_file(picture)] if picture else []
    start = time.monotonic()
    try:
        job = client.submit({"text": text, "files": files}, ANSWER_TOKENS, token, api_name="/chat")
        while not job.done():
            outputs = job.outputs()
            if turn.first_token_s is None and outputs and outputs[-1][1]:
                shown = bubble_text(outputs[-1][1][-1])
                if shown and not shown.startswith((wording.WAITING_MARK, wording.WARNING_MARK)):
                    turn.first_token_s = time.monotonic() - start
            time.sleep(POLL_S)
        _box, chat, status = job.result()
    except Exception as exc:  # noqa: BLE001 — counted, with its reason
        turn.outcome, turn.status = "failed", f"{type(exc).__name__}: {exc}"
        return
    turn.status = status
    if "Answered in" not in status:
        turn.outcome = "refused" if not status.startswith(wording.WARNING_MARK) else "failed"
        return
    turn.answer = bubble_text(chat[-1]).strip()
    if turn.first_token_s is None:
        turn.first_token_s = time.monotonic() - start  # done between two looks
    turn.outcome = "right" if turn.answer == turn.expected else "wrong"


def visit(url: str, i: int, turns_wanted: int, think_s: float, delay_s: float, picture_dir: Path,
          describe_style: str, turns: list[Turn]) -> None:
    """Visitor i: arrives after ``delay_s``, asks its conversation about its own picture at a person's pace."""
    from training.examples import eval_dialogue
    from training.scenes import render_scene

    scene, dialogue = eval_dialogue(i, turns_wanted, describe_style)
    picture = picture_dir / f"visitor-{i}.png"
    render_scene(scene).save(picture)
    rng = random.Random(i)
    time.sleep(delay_s)
    mine = [Turn(i, t.question, t.answer) for t in dialogue]
    turns.extend(mine)
    try:
        client = client_for(url, visitor_address(i))
        token = client.predict(None, api_name="/identity")
    except Exception as exc:  # noqa: BLE001
        for turn in mine:
            turn.outcome, turn.status = "failed", f"{type(exc).__name__}: {exc}"
        return
    for k, turn in enumerate(mine):
        if k:
            time.sleep(rng.uniform(think_s / 2, think_s))
        run_turn(client, token, turn.question, str(picture) if k == 0 else None, turn)
        if turn.outcome in ("refused", "failed"):
            break  # a person whose question was refused or failed stops here: the rest count as not asked
    for turn in mine:
        if not turn.outcome:
            turn.outcome = "failed"
            turn.status = "not asked: an earlier turn was refused or failed"
    client.close()


def hostile_loop(url: str, picture: str, stop: threading.Event, tally: Hostile) -> None:
    """One of the hostile visitor's loops: a new tab and a new identity for every question, each asked again the
    moment it is answered or refused (Retry-After ignored). After a refusal it pauses ``HOSTILE_PAUSE_S``: its own
    CPU is this machine's, which an attacker elsewhere would not take from the server."""
    while not stop.is_set():
        turn = Turn(-1, "describe this image", "")
        try:
            client = client_for(url, HOSTILE)
            token = client.predict(None, api_name="/identity")
        except Exception:  # noqa: BLE001 — a new tab refused: try again
            with tally.lock:
                tally.asked += 1
                tally.refused += 1
            time.sleep(HOSTILE_PAUSE_S)
            continue
        run_turn(client, token, turn.question, picture, turn)
        client.close()
        with tally.lock:
            tally.asked += 1
            tally.answered += turn.outcome in ("right", "wrong")
            tally.refused += turn.outcome == "refused"
            tally.failed += turn.outcome == "failed"
        if turn.outcome not in ("right", "wrong"):
            time.sleep(HOSTILE_PAUSE_S)


def job_waits(stack, prefix: str) -> list[dict]:
    """Every job of the run: its client group, queue wait and service time, from its events in Redis."""
    from worker.client import OwletClient
    from worker.config import Settings

    client = OwletClient(settings=Settings.from_env(redis_url=stack.redis_url, key_prefix=prefix))
    rows = []
    try:
        for key in client.r.scan_iter(match=client.keys.job("*"), count=1000):
            if client.r.type(key) != b"hash":
                continue
            job = key.decode()[len(client.keys.job("")):]
            times = {}
            for _, event in client.events(job):
                times.setdefault(event["type"], float(event["t"]))
            if {"queued", "started", "done"} <= set(times):
                rows.append({"group": (client.r.hget(key, "group") or b"").decode(),
                             "wait_s": times["started"] - times["queued"], "service_s": times["done"] - times["started"]})
    finally:
        client.close()
    return rows


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def run(args) -> dict:
    from owlet.demo import DEFAULT_MODEL, Stack
    from engine.config import max_active_from_env
    from tests.redis_server import unique_prefix
    from tests.ui.stack import free_port
    from training.demo_model import describe_style_of

    share_one_ssl_context()
    work = Path(tempfile.mkdtemp(prefix="owlet-crowd-"))
    prefix = unique_prefix("bench-crowd")
    env = {"OWLET_KEY_PREFIX": prefix}
    ui_args = ["--share"] if args.front == "share" else []
    if args.front == "proxy":
        env["OWLET_UI_TRUSTED_PROXIES"] = "127.0.0.1"
    stack = Stack(None, str(DEFAULT_MODEL), "127.0.0.1", free_port(), ui_args, max_active_from_env() + 2,
                  log_dir=work / "logs", extra_env=env, redis_dir=work / "redis", uploads_dir=work / "uploads")
    turns: list[Turn] = []
    tally = Hostile()
    with stack:
        stack.wait_ready(300)
        url = stack.url
        style = describe_style_of(DEFAULT_MODEL)
        stop = threading.Event()
        hostile_picture = work / "hostile.png"
        from training.examples import eval_dialogue
        from training.scenes import render_scene

        render_scene(eval_dialogue(10**6, 1, style)[0]).save(hostile_picture)
        hostiles = [threading.Thread(target=hostile_loop, args=(url, str(hostile_picture), stop, tally), daemon=True)
                    for _ in range(args.hostile_loops)]
        for h in hostiles:
            h.start()
        time.sleep(args.hostile_head_start_s)  # the hostile visitor is there first, looping
        started = time.monotonic()
        visitors = [threading.Thread(target=visit, args=(url, i, args.turns, args.think_s,
                                                         args.arrive_s * i / max(1, args.visitors), work, style, turns))
                    for i in range(args.visitors)]
        for v in visitors:
            v.start()
        for v in visitors:
            v.join(timeout=1800)
        wall_s = time.monotonic() - started
        stop.set()
        for h in hostiles:
            h.join(timeout=120)
        jobs = job_waits(stack, prefix)
    outcomes = {name: sum(t.outcome == name for t in turns) for name in ("right", "wrong", "refused", "failed")}
    ttft = [t.first_token_s for t in turns if t.first_token_s is not None and t.outcome in ("right", "wrong")]
    service = statistics.median(j["service_s"] for j in jobs) if jobs else float("nan")
    honest = [j for j in jobs if j["group"] != f"addr:{HOSTILE}"]
    worst_wait = max((j["wait_s"] for j in honest), default=float("nan"))
    asked = len(turns)
    result = {
        "front": args.front, "visitors": args.visitors, "turns_per_visitor": args.turns, "turns": asked,
        "answered": outcomes["right"] + outcomes["wrong"], "right": outcomes["right"], "wrong": outcomes["wrong"],
        "refused": outcomes["refused"], "failed": outcomes["failed"],
        "accuracy": outcomes["right"] / asked if asked else 0.0,
        "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p95_s": round(pct(ttft, 0.95), 3),
        "service_s": round(service, 4), "honest_worst_wait_s": round(worst_wait, 3),
        "honest_worst_wait_over_service": round(worst_wait / service, 2) if service else float("nan"),
        "honest_p95_wait_over_service": round(pct([j["wait_s"] for j in honest], 0.95) / service, 2),
        "honest_groups": len({j["group"] for j in honest}),
        "hostile_asked": tally.asked, "hostile_answered": tally.answered, "hostile_refused": tally.refused,
        "hostile_jobs": sum(j["group"] == f"addr:{HOSTILE}" for j in jobs),
        "wall_s": round(wall_s, 1), "cpu": cpu_description(),
    }
    result["examples_of_misses"] = [{"visitor": t.visitor, "question": t.question, "expected": t.expected,
                                     "got": t.answer or t.status} for t in turns if t.outcome != "right"][:5]
    return result


def print_table(r: dict) -> None:
    print(f"\ncrowd through the {r['front']} front: {r['visitors']} visitors x {r['turns_per_visitor']} turns at a "
          f"person's pace, one hostile visitor looping; demo defaults, bundled model")
    print(f"machine: {r['cpu']}\n")
    rows = [("turns asked", r["turns"], ""), ("answered right", r["right"], f"all {r['turns']}"),
            ("answered wrong", r["wrong"], ""), ("refused", r["refused"], TARGETS["refused"]),
            ("failed", r["failed"], TARGETS["failed"]), ("accuracy", f"{r['accuracy']:.3f}", f">= {TARGETS['accuracy']}"),
            ("TTFT p50 as the visitor sees it (s)", r["ttft_p50_s"], ""), ("TTFT p95 (s)", r["ttft_p95_s"], ""),
            ("median service time (s)", r["service_s"], ""),
            ("honest worst queue wait / service", r["honest_worst_wait_over_service"],
             f"<= {TARGETS['honest_worst_wait_over_service']}"),
            ("honest p95 queue wait / service", r["honest_p95_wait_over_service"], ""),
            ("honest client groups in the queue", r["honest_groups"], r["visitors"]),
            ("hostile questions asked / answered / refused", f"{r['hostile_asked']} / {r['hostile_answered']} / "
             f"{r['hostile_refused']}", ""),
            ("wall time (s)", r["wall_s"], "")]
    print(f"{'measure':<48}{'value':>16}   target")
    for name, value, target in rows:
        print(f"{name:<48}{str(value):>16}   {target}")
    for miss in r["examples_of_misses"]:
        print(f"  miss: visitor {miss['visitor']}: {miss['question']!r} expected {miss['expected']!r}, got "
              f"{miss['got'][:120]!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--front", choices=("share", "proxy"), default="share")
    p.add_argument("--visitors", type=int, default=64)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--arrive-s", type=float, default=20.0, help="visitors arrive spread over this many seconds")
    p.add_argument("--think-s", type=float, default=6.0, help="a visitor thinks half to all of this between turns")
    p.add_argument("--hostile-loops", type=int, default=8, help="the hostile visitor's clients, each looping")
    p.add_argument("--hostile-head-start-s", type=float, default=5.0)
    add_quick_flag(p)
    args = parse_with_quick(p, argv, {"visitors": 4, "turns": 2, "arrive_s": 1.0, "think_s": 1.0, "hostile_loops": 2,
                                      "hostile_head_start_s": 1.0})
    result = run(args)
    print_table(result)
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
