"""What the fair queue costs Redis with N visitors waiting: one tree's measurement, for ``bench/queue_scale.py``.

Run as a script path against a source tree (``--root``): this checkout, or an older revision unpacked beside it, so
one run can put two queues side by side. It only uses what every revision offers (``OwletClient``, its ``jobs``
transitions, the page's ``StreamHub``), and prints one JSON line.

    python bench/queue_probe.py --root TREE --redis URL --mode line --waiting N [--ops K]
    python bench/queue_probe.py --root TREE --redis URL --mode tabs --waiting N [--seconds S]
    python bench/queue_probe.py --root TREE --redis URL --mode steps --waiting N --rows R [--ops K]

``line``: N visitors, each its own identity and client group, queue one question each (no worker runs, so they
wait); then each operation runs K times and Redis's own counters give its commands (``INFO commandstats``, calls
inside scripts included) and its CPU (``INFO cpu``, the main thread) per call.

``tabs``: the same N waiting questions, each followed by a page tab for S seconds, as the page follows a waiting
answer: its stream in the page's one stream reader and its place in line once a second. Gives Redis's CPU per
second (cores) and commands per second.

``steps``: a turn's queue steps alone, in the steady state of one busy engine: R of N looping visitors' questions
in flight on one worker, the rest waiting; each turn the worker ends its oldest answer and takes the next question
in the same step (FINISH with its take), and that visitor asks again (SUBMIT, through ``OwletClient.submit``): a
follow-up in the same conversation until it holds C questions (``--conversation-turns``), then a new conversation's
first question. One process, one call at a time, nothing else on the Redis: its CPU per turn (user and system),
commands and round trips per turn, what the queue itself costs a turn without a load sharing the cores.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid


def reads_processed(r) -> int:
    """Requests Redis has read off its clients' sockets so far (a pipeline's commands in one): round trips."""
    return int(r.info("stats")["total_reads_processed"])


def redis_counters(r) -> tuple[int, float]:
    """(commands run so far, main-thread CPU seconds so far) of the Redis ``r`` talks to."""
    return sum(command_calls(r).values()), sum(cpu_split(r))


def command_calls(r) -> dict[str, int]:
    """Calls so far of each command (``INFO commandstats``; a script's own calls are counted too)."""
    return {k[len("cmdstat_"):]: int(v["calls"]) for k, v in r.info("commandstats").items() if k.startswith("cmdstat_")}


class Meter:
    """Commands and Redis CPU between ``start`` and ``stop``, less this meter's own INFO calls."""

    def __init__(self, r):
        self.r = r

    def __enter__(self):
        self.r.config_resetstat()
        self.calls0, self.cpu0 = redis_counters(self.r)
        self.reads0 = reads_processed(self.r)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        calls, cpu = redis_counters(self.r)
        reads = reads_processed(self.r)
        self.calls = calls - self.calls0 - 3  # the first reading's three INFO calls
        self.reads = reads - self.reads0 - 3  # this reading's three
        self.cpu = cpu - self.cpu0


def make_client(args):
    from worker.client import OwletClient
    from worker.config import Settings

    settings = Settings.from_env(redis_url=args.redis, key_prefix=f"owlet-qscale-{uuid.uuid4().hex[:8]}:",
                                 global_queue_cap=10 * args.waiting + 10_000, group_submit_limit=1_000_000,
                                 queue_timeout_s=3600.0)
    return OwletClient(settings=settings)


def submit(client, i: int, conv: str | None = None):
    """Visitor ``i``'s question: its own identity, its own client group, in ``conv`` (None: a new conversation).
    Returns what ``OwletClient.submit`` returns."""
    return client.submit(f"visitor{i}", conv, "What is in the picture?", group=f"addr{i}")


def fill(client, n: int) -> tuple[list[str], float, float]:
    t0 = time.perf_counter()
    with Meter(client.r) as m:
        jobs = [submit(client, i).job for i in range(n)]
    return jobs, time.perf_counter() - t0, m.calls / max(1, n)


def per_call(client, label: str, calls: list) -> dict:
    with Meter(client.r) as m:
        for call in calls:
            call()
    n = max(1, len(calls))
    return {"calls": len(calls), "cmds_per_call": round(m.calls / n, 1), "cpu_us_per_call": round(1e6 * m.cpu / n, 1)}


def line(args) -> dict:
    client = make_client(args)
    try:
        jobs, fill_s, fill_cmds = fill(client, args.waiting)
        rng = random.Random(7)
        k = args.ops
        sample = rng.sample(jobs, min(k, len(jobs)))
        out = {"waiting": args.waiting, "fill_s": round(fill_s, 2), "cmds_per_queued_question": round(fill_cmds, 1)}
        ops = {}
        ops["position"] = per_call(client, "position", [lambda j=j: client.queue_position(j) for j in sample])
        base = args.waiting
        ops["submit"] = per_call(client, "submit", [lambda i=i: submit(client, base + i) for i in range(k)])
        popped: list[str] = []
        capacity = 10 ** 9
        pops = min(k, args.waiting // 2)  # the cancels below need jobs still waiting
        ops["pop"] = per_call(client, "pop", [lambda: popped.append(client.jobs.pop(capacity)[0]) for _ in range(pops)])
        ops["finish"] = per_call(client, "finish", [lambda j=j: client.jobs.finish(j, "done") for j in popped])
        still = [j for j in sample if client.job_state(j) == "queued"][:k]
        ops["cancel"] = per_call(client, "cancel", [lambda j=j: client.jobs.cancel(j) for j in still])
        out["ops"] = ops
        return out
    finally:
        client.close(purge=True)


def steps(args, before_measure=None, after_measure=None) -> dict:
    """``--mode steps`` (the module docstring): K turns in a steady state of ``args.rows`` in flight.
    ``before_measure``: called with the Redis client once the steady state is reached, just before the measured
    turns (``bench/queue_lua_profile.py`` starts its counts there); ``after_measure``: the same, just after them,
    before anything else runs (the purge of the probe's keys)."""
    client = make_client(args)
    worker = "probe-worker@host"
    rows = args.rows
    answer = json.dumps({"role": "assistant", "text": "word " * 48})
    chats: dict[int, tuple[str, int]] = {}  # visitor -> (its conversation, questions asked in it)

    def ask(visitor: int) -> str:
        conv, asked = chats.get(visitor, (None, 0))
        if asked >= args.conversation_turns:
            conv, asked = None, 0
        sub = submit(client, visitor, conv)
        chats[visitor] = (sub.conv, asked + 1)
        return sub.job

    try:
        owner = {}  # job -> the visitor who asked it
        for i in range(args.waiting):
            owner[ask(i)] = i
        running = []
        for _ in range(rows):
            taken = client.jobs.take(rows, rows, worker)
            running.append(taken.job)
        # the worker's heartbeat, as a live worker keeps it: a submit reads the slots from it (at most once a second)
        from worker import heartbeat

        heartbeat.publish(client.r, client.keys, heartbeat.Heartbeat(worker, capacity=rows, rows=rows), ttl_s=3600)

        def turn() -> None:
            job = running.pop(0)
            ended, taken = client.jobs.finish_and_take(job, "done", answer_turn=answer, holder=worker,
                                                       service_s=0.2, take=(rows, rows, worker))
            assert ended and taken is not None and taken.started is not None, "a steady state keeps every row busy"
            running.append(taken.job)
            visitor = owner.pop(job)
            owner[ask(visitor)] = visitor  # the visitor whose answer ended asks again

        # warm: every visitor's counters and the line in their steady state, and its conversations at every length
        for _ in range(max(min(args.ops, 100), 2 * args.waiting * args.conversation_turns)):
            turn()
        if before_measure is not None:
            before_measure(client.r)
        before = cpu_split(client.r)
        with Meter(client.r) as m:
            for _ in range(args.ops):
                turn()
        after = cpu_split(client.r)
        if after_measure is not None:
            after_measure(client.r)
        n = max(1, args.ops)
        user, system = after[0] - before[0], after[1] - before[1]
        return {"waiting": args.waiting - rows, "rows": rows, "turns": args.ops,
                "conversation_turns": args.conversation_turns, "cmds_per_turn": round(m.calls / n, 1),
                "round_trips_per_turn": round(m.reads / n, 2),
                "cpu_us_per_turn": round(1e6 * (user + system) / n, 1),
                "user_us_per_turn": round(1e6 * user / n, 1), "system_us_per_turn": round(1e6 * system / n, 1)}
    finally:
        client.close(purge=True)


def cpu_split(r) -> tuple[float, float]:
    """(user, system) CPU seconds of the Redis ``r`` talks to, its main thread."""
    cpu = r.info("cpu")
    return (float(cpu.get("used_cpu_user_main_thread", cpu["used_cpu_user"])),
            float(cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"])))


def tabs(args) -> dict:
    """N waiting questions followed as the page follows them, for ``args.seconds``."""
    client = make_client(args)
    try:
        jobs, _, _ = fill(client, args.waiting)
        return asyncio.run(follow(client, jobs, args))
    finally:
        client.close(purge=True)


async def follow(client, jobs: list[str], args) -> dict:
    from ui.chat.stream_hub import StreamHub

    hub = StreamHub(client)
    # A hub that polls its waiting followers' places itself (one call a second for all); an earlier page instead had
    # each waiting tab ask for its own place once a second.
    hub_polls = hasattr(hub, "place_poll_s")
    seen: list[int] = []

    def deliver(events, ended):
        seen.append(len(events))

    for job in jobs:
        hub.subscribe(job, deliver)
    await asyncio.sleep(1.0)  # the hub's first reads of every stream (their queued events) come before the window

    async def tab(job: str, offset: float):
        await asyncio.sleep(offset)
        while True:
            await asyncio.to_thread(client.queue_position, job)
            await asyncio.sleep(1.0)

    pollers = [] if hub_polls else [asyncio.create_task(tab(j, i / len(jobs))) for i, j in enumerate(jobs)]
    await asyncio.sleep(0.5)
    with Meter(client.r) as m:
        await asyncio.sleep(args.seconds)
    for p in pollers:
        p.cancel()
    hub.close()
    return {"waiting": args.waiting, "seconds": round(m.wall, 2), "redis_cores": round(m.cpu / m.wall, 3),
            "cmds_per_s": round(m.calls / m.wall), "places_read_by": "the hub, at once" if hub_polls else "each tab"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the source tree whose queue is measured")
    ap.add_argument("--redis", required=True, help="a private Redis's URL")
    ap.add_argument("--mode", choices=("line", "tabs", "steps"), required=True)
    ap.add_argument("--waiting", type=int, required=True)
    ap.add_argument("--ops", type=int, default=100, help="calls of each operation (line)")
    ap.add_argument("--seconds", type=float, default=5.0, help="the measured window (tabs)")
    ap.add_argument("--rows", type=int, default=64, help="questions in flight on the one worker (steps)")
    ap.add_argument("--conversation-turns", type=int, default=1,
                    help="questions a visitor asks in one conversation before starting a new one (steps)")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.root)
    print(json.dumps({"line": line, "tabs": tabs, "steps": steps}[args.mode](args)), flush=True)


if __name__ == "__main__":
    main()
