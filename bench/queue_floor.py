"""The least a turn's two queue scripts can cost this Redis, side by side with what Owlet's cost.

A turn of the queue is two calls: the visitor's question (SUBMIT) and its worker's end of the answer before it with
the take of the next question (FINISH). Whatever the design, each must still write what Owlet promises to keep:
the job (its payload, its state, its expiry), the conversation's turns, the three events of the job's stream
(queued, started, done), the line and what is in flight, a group's use of the workers and its rate and text quota.
This benchmark runs a model queue that does only that, in two functions of a library of its own (first come, first
served, one sorted set for the line, one for what is in flight; no identities inside groups, no slots kept for
newcomers, no picture or history budgets, no caps read, no holder of a conversation's cache): 30 commands a turn,
its two calls included, where Owlet's run 85. Its CPU per turn is a floor for any queue that keeps those writes in
Redis scripts on this server; Owlet's steps part (``bench/queue_probe.py --mode steps``) runs beside it in the same
steady state: 64 of 72 looping visitors in flight on one worker, each turn the worker ends its oldest answer and
takes the next question, and that visitor asks again (a new conversation's first question), one call at a time,
alternating the two.

    .venv/bin/python -m bench.queue_floor [--turns 3000] [--rows 64] [--repeats 2] [--quick]

Ends with ``RESULT {json}``: ``floor_us_per_turn`` and ``owlet_us_per_turn`` (medians of the repeats: Redis's
main-thread CPU per turn), ``owlet_over_floor``, ``floor_cmds_per_turn``, ``owlet_cmds_per_turn``, both
``..._round_trips_per_turn``, ``owlet_cmds_over_floor`` and ``ping_us`` (what one PING round trip costs this
Redis: the yardstick).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402

LIBRARY = "owlet_bench_floor"
# The model queue: one JSON object of named arguments a call, as Owlet's scripts take theirs (``p``: the key prefix).
FLOOR_LIBRARY = f"""#!lua name={LIBRARY}
local function submit(_, argv)
  local a = cjson.decode(argv[1])
  local p = a.p
  local jk, sk, ck = p .. 'job:' .. a.job, p .. 'stream:' .. a.job, p .. 'conv:' .. a.conv
  redis.call('INCR', p .. 'rate:' .. a.group)
  redis.call('INCRBY', p .. 'text:' .. a.user, #a.payload + #a.turn)
  -- the group's recent use sets its question's place (here it is only read: first come, first served)
  redis.call('GET', p .. 'usage:' .. a.group)
  redis.call('HSET', ck, 'user', a.user, 'pending', a.job)
  redis.call('RPUSH', ck .. ':turns', a.turn)
  redis.call('EXPIRE', ck, a.ttl)
  redis.call('EXPIRE', ck .. ':turns', a.ttl)
  redis.call('HSET', jk, 'payload', a.payload, 'user', a.user, 'group', a.group, 'conv', a.conv, 'state', 'queued',
             'enqueued_at', a.now)
  redis.call('EXPIRE', jk, a.ttl)
  redis.call('ZADD', p .. 'line', redis.call('INCR', p .. 'seq'), a.job)
  local position = redis.call('ZRANK', p .. 'line', a.job) + 1
  redis.call('XADD', sk, 'MAXLEN', '~', '10000', '*', 'type', 'queued', 'data', '{{"position": ' .. position .. '}}')
  redis.call('EXPIRE', sk, a.ttl)
  return position
end
local function finish_take(_, argv)
  local a = cjson.decode(argv[1])
  local p = a.p
  local jk, sk = p .. 'job:' .. a.job, p .. 'stream:' .. a.job
  local f = redis.call('HMGET', jk, 'state', 'conv', 'group')
  if f[1] ~= 'started' then return {{0}} end
  local ck = p .. 'conv:' .. f[2]
  redis.call('RPUSH', ck .. ':turns', a.answer)
  redis.call('HDEL', ck, 'pending')
  redis.call('HSET', jk, 'state', 'done')
  redis.call('EXPIRE', jk, a.ttl)
  redis.call('XADD', sk, 'MAXLEN', '~', '10000', '*', 'type', 'done', 'data', a.data)
  redis.call('EXPIRE', sk, a.ttl)
  redis.call('ZREM', p .. 'inflight', a.job)
  redis.call('SET', p .. 'usage:' .. f[3], a.now, 'EX', '2400')
  local head = redis.call('ZPOPMIN', p .. 'line')
  local job = head[1]
  if not job then return {{1}} end
  local nk = p .. 'job:' .. job
  local g = redis.call('HMGET', nk, 'payload', 'conv')
  redis.call('HSET', nk, 'state', 'started', 'worker', a.worker, 'started_at', a.now)
  redis.call('ZADD', p .. 'inflight', a.now, job)
  redis.call('XADD', p .. 'stream:' .. job, 'MAXLEN', '~', '10000', '*', 'type', 'started', 'data', '{{}}')
  return {{1, job, g[1], g[2]}}
end
redis.register_function('{LIBRARY}_submit', submit)
redis.register_function('{LIBRARY}_finish_take', finish_take)
"""


class FloorQueue:
    """The model queue's two calls, with payloads the size of Owlet's for the same question and answer."""

    def __init__(self, r, prefix: str):
        self.r, self.p = r, prefix
        r.function_load(FLOOR_LIBRARY, replace=True)
        self.answer = json.dumps({"role": "assistant", "text": "word " * 48})

    def submit(self, visitor: int, now: str) -> str:
        job, conv = uuid.uuid4().hex, uuid.uuid4().hex
        payload = json.dumps({"job_id": job, "user": f"visitor{visitor}", "conv": conv, "turn": 0,
                              "messages": [{"role": "user", "text": "What is in the picture?", "image_sha": None}],
                              "sampling": {}})
        turn = json.dumps({"role": "user", "text": "What is in the picture?", "image_sha": None, "job_id": job})
        self.r.fcall(f"{LIBRARY}_submit", 0, json.dumps(
            {"p": self.p, "job": job, "user": f"visitor{visitor}", "group": f"addr{visitor}", "conv": conv,
             "payload": payload, "turn": turn, "now": now, "ttl": 7500}))
        return job

    def finish_take(self, job: str, now: str) -> str | None:
        reply = self.r.fcall(f"{LIBRARY}_finish_take", 0, json.dumps(
            {"p": self.p, "job": job, "answer": self.answer, "data": json.dumps({"t": float(now)}), "worker": "w",
             "now": now, "ttl": 3600}))
        return reply[1].decode() if len(reply) > 1 else None


def floor_steps(url: str, visitors: int, rows: int, turns: int) -> dict:
    """The model queue in the steps part's steady state: per turn, Redis's CPU, commands and round trips."""
    import time

    import redis

    from bench.queue_probe import Meter

    r = redis.Redis.from_url(url)
    prefix = f"owlet-floor-{uuid.uuid4().hex[:8]}:"
    queue = FloorQueue(r, prefix)
    try:
        owner = {}
        for i in range(visitors):
            owner[queue.submit(i, repr(time.time()))] = i
        running = []
        for _ in range(rows):  # the worker's first takes: end nothing, take the head
            head = r.zpopmin(prefix + "line")[0][0].decode()
            r.hset(prefix + "job:" + head, "state", "started")
            r.zadd(prefix + "inflight", {head: time.time()})
            running.append(head)

        def turn() -> None:
            job = running.pop(0)
            taken = queue.finish_take(job, repr(time.time()))
            assert taken is not None, "a steady state keeps every row busy"
            running.append(taken)
            visitor = owner.pop(job)
            owner[queue.submit(visitor, repr(time.time()))] = visitor

        for _ in range(max(100, 2 * visitors)):
            turn()
        with Meter(r) as m:
            for _ in range(turns):
                turn()
        return {"cpu_us_per_turn": round(1e6 * m.cpu / turns, 1), "cmds_per_turn": round(m.calls / turns, 1),
                "round_trips_per_turn": round(m.reads / turns, 2)}
    finally:
        for key in r.scan_iter(match=prefix + "*", count=1000):
            r.unlink(key)
        r.function_delete(LIBRARY)


def owlet_steps(url: str, visitors: int, rows: int, turns: int) -> dict:
    from bench import queue_probe

    args = argparse.Namespace(root=str(ROOT), redis=url, mode="steps", waiting=visitors, rows=rows, ops=turns,
                              conversation_turns=1)
    return queue_probe.steps(args)


def main(argv=None) -> dict:
    from bench.queue_scale import ping_cost_us, private_redis

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--turns", type=int, default=3000, help="turns measured per run")
    ap.add_argument("--rows", type=int, default=64, help="questions in flight on the one worker")
    ap.add_argument("--visitors", type=int, default=None, help="looping visitors (default: rows + 8)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each queue, alternating")
    args = parse_with_quick(ap, argv, {"turns": 50, "rows": 8, "repeats": 1})
    visitors = args.visitors or args.rows + 8
    runs: dict[str, list[dict]] = {"floor": [], "owlet": []}
    with tempfile.TemporaryDirectory(prefix="owlet-queue-floor-") as work, private_redis(Path(work)) as url:
        ping_us = ping_cost_us(url)
        for _ in range(args.repeats):
            runs["floor"].append(floor_steps(url, visitors, args.rows, args.turns))
            runs["owlet"].append(owlet_steps(url, visitors, args.rows, args.turns))
    print(f"machine: {cpu_description()}; Redis of its own; one call at a time; a PING costs it {ping_us:.1f} us")
    print(f"steady state: {args.rows} of {visitors} looping visitors in flight, {args.turns} turns a run, "
          f"{args.repeats} run(s) of each queue, alternating\n")
    print(f"{'queue':<28} {'Redis us/turn, by run':>28} {'median':>8} {'cmds/turn':>10} {'round trips':>12}")
    result: dict = {"cpu": cpu_description(), "turns": args.turns, "rows": args.rows, "visitors": visitors,
                    "repeats": args.repeats, "ping_us": round(ping_us, 2)}
    labels = {"floor": "model queue (the floor)", "owlet": "Owlet's queue (steps part)"}
    for name in ("floor", "owlet"):
        us = [run["cpu_us_per_turn"] for run in runs[name]]
        median = statistics.median(us)
        print(f"{labels[name]:<28} {', '.join(f'{u:.0f}' for u in us):>28} {median:>8.1f} "
              f"{runs[name][0]['cmds_per_turn']:>10} {runs[name][0]['round_trips_per_turn']:>12}")
        result[f"{name}_us_per_turn"] = round(median, 1)
        result[f"{name}_us_per_turn_runs"] = us
        result[f"{name}_cmds_per_turn"] = runs[name][0]["cmds_per_turn"]
        result[f"{name}_round_trips_per_turn"] = runs[name][0]["round_trips_per_turn"]
    result["owlet_over_floor"] = round(result["owlet_us_per_turn"] / result["floor_us_per_turn"], 2)
    result["owlet_cmds_over_floor"] = round(result["owlet_cmds_per_turn"] / result["floor_cmds_per_turn"], 2)
    print(f"\nOwlet's turn over the floor's: {result['owlet_over_floor']}x")
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
