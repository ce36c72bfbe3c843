"""Test-only views and edits of the fair line's state (``worker/queue/lua/line.lua``), through its own helpers.

A test that needs a group "as if it had waited out its setback" rewrites that group's key with the line's own
``rekey``, so its queued jobs' tags stay consistent; reading a key parses the place the line stores.
"""
from __future__ import annotations

import json
import time

from worker.queue.fairness import FIFO_QUEUE
from worker.queue.scripts import compose
from worker.store.keys import JobField

_SET_KEY = compose("""#!lua
local qg = args.group
local old = redis.call('HGET', KEY.places, qg)
redis.call('HSET', KEY.places, qg, waiting_place(args.key))
rekey(qg, old)
return 1
""", "set_waiting_key")


def waiting_key(client, group: str) -> float | None:
    """The key a waiting (not yet served) group is ordered by in its round: when it started waiting plus its
    setback, in Redis time; None when it is not waiting with a key."""
    place = client.r.hget(client.keys.places, group)
    if place is None or not place.startswith(b"1"):
        return None
    return float(place[2:22])


def set_waiting_key(client, group: str, key: float) -> None:
    """Give waiting group ``group`` the key ``key`` (e.g. as if it had waited out its setback)."""
    script = client.r.register_script(_SET_KEY)
    script(keys=[], args=[json.dumps({"prefix": client.keys.prefix, "group": group, "key": key})])

_FILL = compose("""#!lua
for i = 1, args.n do
  local job, who = args.name .. i, args.name .. i
  local q = args.queue or who
  redis.call('HSET', KEY.job .. job, JOB.user, who, JOB.qkey, q, JOB.group, who, JOB.qgroup, q,
             JOB.state, STATE.queued, JOB.payload, '{}')
  redis.call('HINCRBY', KEY.queued_by_group, who, 1)
  queued_by_user_add(who, q, 1)
  queue_job(job, q, q)
  redis.call('ZADD', KEY.queued_since, args.now, job)
end
return args.n
""", "fill_line")


def fill_line(client, n: int, name: str = "v") -> list[str]:
    """Queue ``n`` jobs at once, each its own identity and client group (``<name>1`` ... ``<name>n``, the job ids
    too), through the line's own ``queue_job``: the state SUBMIT leaves for a visitor's first question, without its
    conversation (in FIFO mode, ``client``'s settings, each waits in the one shared queue, as SUBMIT puts it there).
    Returns the job ids."""
    script = client.r.register_script(_FILL)
    named = {"prefix": client.keys.prefix, "n": n, "name": name, "now": repr(time.time())}
    if client.settings.fifo:
        named["queue"] = FIFO_QUEUE
    script(keys=[], args=[json.dumps(named)])
    return [f"{name}{i}" for i in range(1, n + 1)]


def line_index_errors(client) -> list[str]:
    """What is wrong with the line's indexes (line.lua), empty when they are right: the index of groups with nothing
    in flight (``idle_line`` and ``light_line``) must hold exactly the groups in line (with a place) and nothing in
    flight, each as its place followed by the group, in both sets; every job in line must be there under its group's
    place (POP reads a group's place off the member it finds); and ``waiting_since`` must hold exactly the groups
    waiting with a key (places of tier 1)."""
    keys, r = client.keys, client.r
    places = {g.decode(): p.decode() for g, p in r.hgetall(keys.places).items()}
    flying = {g.decode() for g in r.hkeys(keys.inflight_by_group)}
    expected = {places[g] + g for g in places if g not in flying}
    errors = []
    for name in ("idle_line", "light_line"):
        held = {m.decode() for m in r.zrange(getattr(keys, name), 0, -1)}
        if held != expected:
            errors.append(f"{name}: extra {sorted(held - expected)}, missing {sorted(expected - held)}")
    width = len(next(iter(places.values()), ""))
    for member in r.zrange(keys.line, 0, -1):
        place, job = member.decode()[:width], member.decode()[width:]
        group = (r.hget(keys.job(job), JobField.qgroup) or b"").decode()
        if places.get(group) != place:
            errors.append(f"line: job {job} of {group!r} at place {place}, its group's is {places.get(group)}")
    waiting = {g.decode() for g in r.zrange(keys.waiting_since, 0, -1)}
    keyed = {g for g, p in places.items() if p.startswith("1")}
    if waiting != keyed:
        errors.append(f"waiting_since: extra {sorted(waiting - keyed)}, missing {sorted(keyed - waiting)}")
    return errors
