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

Two phases on the same stack, side by side: the visitors alone, then as many new visitors (new addresses, the same
scenes) beside the hostile visitor, who is there first. Printed for each: the visitors' turns answered right,
refused, failed; their time to first token as the client sees it, p50 and p95; and each visitor turn's queue wait
(its job's queued -> started events, read from Redis) over the median service time of the phase's jobs
(started -> done): the worst is the figure to read. Then how the hostile visitor's questions ended. The targets
apply to the phase with the hostile visitor. Ends with ``RESULT {json}`` (its top level: that phase; ``no_hostile``:
the other).
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
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
    reasons: Counter = field(default_factory=Counter)  # how its questions ended, by the start of their status
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
    from ui.shared import wording

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
        # gradio_client's AppError carries the page's sentence (a refused upload's, a named file's): a refusal
        turn.outcome = "refused" if type(exc).__name__ == "AppError" else "failed"
        turn.status = f"{type(exc).__name__}: {exc}"
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
        except Exception as exc:  # noqa: BLE001 — a new tab refused: try again
            with tally.lock:
                tally.asked += 1
                tally.refused += 1
                tally.reasons[f"{type(exc).__name__}: {str(exc)[:70]}"] += 1
            time.sleep(HOSTILE_PAUSE_S)
            continue
        run_turn(client, token, turn.question, picture, turn)
        client.close()
        with tally.lock:
            tally.asked += 1
            tally.answered += turn.outcome in ("right", "wrong")
            tally.refused += turn.outcome == "refused"
            tally.failed += turn.outcome == "failed"
            tally.reasons["answered" if turn.outcome in ("right", "wrong") else turn.status[:80]] += 1
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


def run_phase(url: str, args, first: int, hostile_loops: int, work: Path, style: str) -> tuple[list[Turn], Hostile,
                                                                                             float]:
    """Visitors ``first`` .. ``first + args.visitors - 1`` (each its address and scene), beside the hostile visitor's
    ``hostile_loops`` loops (there first, by ``args.hostile_head_start_s``). Returns the visitors' turns, the hostile
    visitor's tally and the phase's wall time."""
    turns: list[Turn] = []
    tally = Hostile()
    stop = threading.Event()
    hostile_picture = work / "hostile.png"
    if hostile_loops:
        from training.examples import eval_dialogue
        from training.scenes import render_scene

        render_scene(eval_dialogue(10**6, 1, style)[0]).save(hostile_picture)
    hostiles = [threading.Thread(target=hostile_loop, args=(url, str(hostile_picture), stop, tally), daemon=True)
                for _ in range(hostile_loops)]
    for h in hostiles:
        h.start()
    if hostiles:
        time.sleep(args.hostile_head_start_s)  # the hostile visitor is there first, looping
    started = time.monotonic()
    visitors = [threading.Thread(target=visit, args=(url, first + i, args.turns, args.think_s,
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
    return turns, tally, wall_s


def phase_figures(turns: list[Turn], jobs: list[dict], first: int, visitors: int, hostile: bool) -> dict:
    """One phase's figures: its visitors' turns, and the queue waits and service times of its jobs (its visitors'
    and, with the hostile visitor, the hostile visitor's)."""
    groups = {f"addr:{visitor_address(i)}" for i in range(first, first + visitors)}
    honest = [j for j in jobs if j["group"] in groups]
    mine = honest + ([j for j in jobs if j["group"] == f"addr:{HOSTILE}"] if hostile else [])
    outcomes = {name: sum(t.outcome == name for t in turns) for name in ("right", "wrong", "refused", "failed")}
    ttft = [t.first_token_s for t in turns if t.first_token_s is not None and t.outcome in ("right", "wrong")]
    service = statistics.median(j["service_s"] for j in mine) if mine else float("nan")
    worst_wait = max((j["wait_s"] for j in honest), default=float("nan"))
    return {"turns": len(turns), "answered": outcomes["right"] + outcomes["wrong"], **outcomes,
            "accuracy": outcomes["right"] / len(turns) if turns else 0.0,
            "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p95_s": round(pct(ttft, 0.95), 3),
            "service_s": round(service, 4), "honest_worst_wait_s": round(worst_wait, 3),
            "honest_worst_wait_over_service": round(worst_wait / service, 2) if service else float("nan"),
            "honest_p95_wait_over_service": round(pct([j["wait_s"] for j in honest], 0.95) / service, 2),
            "honest_groups": len({j["group"] for j in honest})}


def run(args) -> dict:
    from engine.config import max_active_from_env
    from owlet.demo import DEFAULT_MODEL, Stack
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
    n = args.visitors
    with stack:
        stack.wait_ready(300)
        style = describe_style_of(DEFAULT_MODEL)
        warm: list[Turn] = []  # the model's first answers, not counted: addresses past both phases'
        for thread in [threading.Thread(target=visit, args=(stack.url, 2 * n + i, 1, 0.0, 0.0, work, style, warm))
                       for i in range(4)]:
            thread.start()
            thread.join(timeout=300)
        alone, _, alone_wall = run_phase(stack.url, args, 0, 0, work, style)
        crowd, tally, wall_s = run_phase(stack.url, args, n, args.hostile_loops, work, style)
        jobs = job_waits(stack, prefix)
    result = {"front": args.front, "visitors": n, "turns_per_visitor": args.turns,
              **phase_figures(crowd, jobs, n, n, hostile=True),
              "no_hostile": phase_figures(alone, jobs, 0, n, hostile=False),
              "hostile_asked": tally.asked, "hostile_answered": tally.answered, "hostile_refused": tally.refused,
              "hostile_failed": tally.failed, "hostile_jobs": sum(j["group"] == f"addr:{HOSTILE}" for j in jobs),
              "hostile_outcomes": dict(tally.reasons.most_common(4)),
              "wall_s": round(wall_s, 1), "no_hostile_wall_s": round(alone_wall, 1), "cpu": cpu_description()}
    result["examples_of_misses"] = [{"visitor": t.visitor, "question": t.question, "expected": t.expected,
                                     "got": t.answer or t.status} for t in crowd + alone if t.outcome != "right"][:6]
    shutil.rmtree(work, ignore_errors=True)  # the stack's Redis, uploads, pictures and logs
    return result


def print_table(r: dict) -> None:
    a = r["no_hostile"]
    print(f"\ncrowd through the {r['front']} front: {r['visitors']} visitors x {r['turns_per_visitor']} turns at a "
          f"person's pace, alone and beside one hostile visitor looping; demo defaults, bundled model")
    print(f"machine: {r['cpu']}\n")
    rows = [("turns asked", "turns", ""), ("answered right", "right", "all"), ("answered wrong", "wrong", ""),
            ("refused", "refused", TARGETS["refused"]), ("failed", "failed", TARGETS["failed"]),
            ("accuracy", "accuracy", f">= {TARGETS['accuracy']}"),
            ("TTFT p50 as the visitor sees it (s)", "ttft_p50_s", ""), ("TTFT p95 (s)", "ttft_p95_s", ""),
            ("median service time (s)", "service_s", ""), ("honest worst queue wait (s)", "honest_worst_wait_s", ""),
            ("honest worst queue wait / service", "honest_worst_wait_over_service",
             f"<= {TARGETS['honest_worst_wait_over_service']} (with the hostile visitor)"),
            ("honest p95 queue wait / service", "honest_p95_wait_over_service", ""),
            ("honest client groups in the queue", "honest_groups", r["visitors"])]
    print(f"{'measure':<40}{'alone':>12}{'with hostile':>14}   target")
    for name, key, target in rows:
        value = r[key]
        shown = [f"{v:.3f}" if key == "accuracy" else str(v) for v in (a[key], value)]
        print(f"{name:<40}{shown[0]:>12}{shown[1]:>14}   {target}")
    print(f"\nthe hostile visitor: {r['hostile_asked']} questions asked (each a new tab and identity), "
          f"{r['hostile_answered']} answered, {r['hostile_refused']} refused, {r['hostile_failed']} failed; "
          f"{r['hostile_jobs']} jobs admitted")
    for reason, count in r["hostile_outcomes"].items():
        print(f"  {count:>5}  {reason}")
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
