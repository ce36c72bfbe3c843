"""Where a turn's Redis time goes inside the queue's scripts: each Lua helper's own time per turn, in the steady
state ``bench.queue_scale`` measures as its steps part (FINISH with the take of the next question, and the next
SUBMIT; ``bench/queue_probe.py --mode steps``).

Redis 7.0 gives a script no clock of its own, so the profile reads Redis's: the library is built as Owlet builds it
(``worker.queue.scripts.library``), and then every helper of common.lua and the helper files, and every script's
body, is wrapped in a function that reads ``TIME`` before and after the call and adds the difference to that
helper's total. A helper's own time is its total less its wrapped callees' totals, less what the wrapping itself
costs: measured in the same run (``calibrate``: a wrapped helper that does nothing, called by another many times,
the least of forty short such measurements) and taken off per call and per wrapped callee. What remains is the helper's
Lua and the commands it calls itself.

Two runs on one private Redis, in one process: the library as it ships (Redis's CPU per turn, and its time in the
scripts by ``INFO commandstats``), then the wrapped one. The own times of the wrapped run add up to about the
first's script time when the calibration holds; the table gives both, so a reader sees how far to trust it. Times
are Redis's wall clock in a script, which is its CPU while nothing else runs on its core: with ``--repeats`` the two
runs alternate that many times and the least disturbed of each kind is reported (its scripts' time the smallest), as
the quick run does (three of each: the suite runs it beside other work, where a run preempted midway read 400 µs of
scripts in 340 µs of Redis CPU).

    .venv/bin/python -m bench.queue_lua_profile [--turns 3000] [--conversation-turns 1] [--rows 64] [--repeats 1]
                                                [--quick]

Ends with ``RESULT {json}``: ``redis_us_per_turn`` and ``scripts_us_per_turn`` (the library as it ships),
``profiled_own_us_per_turn`` (the sum of the wrapped run's own times) and ``profiled_over_scripts`` (that sum over
the shipped run's script time: near 1 when the calibration holds), ``timer_cost_us`` (the wrapping's cost per wrapped
call) and ``own_us_per_turn``: each helper's own time per turn. Also the shipped run's split of a turn's Redis CPU:
``commands_us_per_turn`` (the commands' own work, as ``INFO commandstats`` times each one inside the scripts),
``script_overhead_us_per_turn`` (the scripts' time less that: their Lua, their arguments' decoding and Redis's handling
of each call they make, which ``call_cost_us`` measures per call in a warm loop), ``outside_scripts_us_per_turn``
(Redis's CPU less the scripts' time: the round trips), ``floor_us_per_turn`` (commands plus round trips: what a
turn of these commands and round trips costs even with no script overhead) and ``commands_over_scripts``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402

# Left unwrapped: what runs once a call or on load, not on a turn's path; and the one-line helpers that call no
# command (a key's name, a member's parts), whose time is less than what a wrapping costs and would be mostly error.
UNWRAPPED = {"settings_for", "keys_for", "begin_call", "uq", "gq", "job_of", "group_of_idle"}
# Calibrations a profiled run takes, the least of each cost kept: a calibration preempted or slowed midway reads a
# dearer wrapping, and taking that off every wrapped call would leave the helpers' own times short (the quick run
# beside other work read own times adding up to 0.45 of the scripts' time that way, and 0.38 with five
# calibrations of 2,000 calls each, every one of which ran long enough, 7 ms, to be preempted: 10 us a call against
# 1.6 us on a quiet core). So many short ones: 100 calls take about 0.3 ms, well inside a scheduler's time slice.
CALIBRATION_CALLS = 100
CALIBRATIONS = 40

WRAPPING = """
local PROFILE, PROFILE_STACK = {}, {}
local function profile_clock() local t = redis.call('TIME') return tonumber(t[1]) * 1e6 + tonumber(t[2]) end
local function profile_pack(...) return {n = select('#', ...), ...} end
-- fn, its calls counted as `name`: {total us, calls, wrapped callees' total us, wrapped callees' calls}
local function profiled(name, fn)
  return function(...)
    local frame = {0, 0}
    table.insert(PROFILE_STACK, frame)
    local t0 = profile_clock()
    local out = profile_pack(fn(...))
    local spent = profile_clock() - t0
    table.remove(PROFILE_STACK)
    local caller = PROFILE_STACK[#PROFILE_STACK]
    if caller then caller[1], caller[2] = caller[1] + spent, caller[2] + 1 end
    local p = PROFILE[name] or {0, 0, 0, 0}
    p[1], p[2], p[3], p[4] = p[1] + spent, p[2] + 1, p[3] + frame[1], p[4] + frame[2]
    PROFILE[name] = p
    return unpack(out, 1, out.n)
  end
end
local profile_nothing = profiled('(nothing)', function() end)
local profile_caller = profiled('(caller)', function(n) for _ = 1, n do profile_nothing() end end)
"""
READOUT = """
redis.register_function{function_name = '%(lib)s_profile', callback = function()
  local out = {}
  for name, p in pairs(PROFILE) do
    table.insert(out, {name, tostring(p[1]), tostring(p[2]), tostring(p[3]), tostring(p[4])})
  end
  PROFILE = {}
  return out
end}
redis.register_function{function_name = '%(lib)s_calibrate', callback = function(_, argv)
  profile_caller(tonumber(argv[1]))
  return 1
end}
"""


def helpers() -> list[str]:
    """The local functions of common.lua and the helper files, as the library defines them."""
    from worker.queue import scripts

    names = []
    for part in (scripts.COMMON, *scripts.HELPERS):
        names += re.findall(r"^local function (\w+)\(", scripts.lua_file(part), re.M)
    return [n for n in names if n not in UNWRAPPED]


def profiled_library() -> tuple[str, str]:
    """Owlet's library with every helper and script body wrapped (the module docstring), under a name of its own,
    with ``<name>_profile`` (each wrapped name's counts since the last read, which it clears) and
    ``<name>_calibrate`` (the wrapping's cost)."""
    from worker.queue import scripts

    lib, text = scripts.library()
    bodies_at = text.index("local function submit_body()")
    wraps = "\n".join(f"{n} = profiled('{n}', {n})" for n in helpers())
    text = text[:bodies_at] + WRAPPING + wraps + "\n" + text[bodies_at:]
    registered_at = text.index("\nredis.register_function")
    body_wraps = "\n".join(f"{n}_body = profiled('script {n}', {n}_body)" for n in scripts.SCRIPTS)
    text = text[:registered_at] + "\n" + body_wraps + text[registered_at:]
    name = lib + "p"
    text = text.replace(f"#!lua name={lib}", f"#!lua name={name}", 1).replace(f'"{lib}_', f'"{name}_')
    return name, text + READOUT % {"lib": name}


def read_profile(r, lib: str) -> dict[str, tuple[float, int, float, int]]:
    """Each wrapped name's (total us, calls, wrapped callees' total us, wrapped callees' calls) since the last read."""
    return {row[0].decode(): (float(row[1]), int(row[2]), float(row[3]), int(row[4]))
            for row in r.fcall(f"{lib}_profile", 0)}


def calibrate(r, lib: str) -> tuple[float, float]:
    """(us a wrapped call adds to its own total, us it adds to its caller's own time): the least of ``CALIBRATIONS``
    measurements of each."""
    read_profile(r, lib)
    insides, arounds = [], []
    for _ in range(CALIBRATIONS):
        r.fcall(f"{lib}_calibrate", 0, CALIBRATION_CALLS)
        p = read_profile(r, lib)
        nothing, caller = p["(nothing)"], p["(caller)"]
        inside = nothing[0] / nothing[1]
        insides.append(inside)
        arounds.append(max(0.0, (caller[0] - caller[2] - inside) / caller[3]))
    return min(insides), min(arounds)


def steps_run(url: str, args, before_measure, after_measure=None) -> dict:
    from bench import queue_probe

    probe_args = argparse.Namespace(root=str(ROOT), redis=url, mode="steps", waiting=args.rows + 8, rows=args.rows,
                                    ops=args.turns, conversation_turns=args.conversation_turns)
    return queue_probe.steps(probe_args, before_measure=before_measure, after_measure=after_measure)


def script_usec(r) -> tuple[int, int]:
    """Redis's microseconds since its statistics were last reset: (in FCALL, what the scripts call included; in the
    commands themselves, each one's own work as Redis times it, wherever it was called). The probe's own statistics
    calls (INFO, CONFIG RESETSTAT) are left out."""
    stats = r.info("commandstats")
    scripts = int(stats.get("cmdstat_fcall", {}).get("usec", 0))
    commands = sum(int(v["usec"]) for k, v in stats.items()
                   if k != "cmdstat_fcall" and not k.startswith(("cmdstat_info", "cmdstat_config")))
    return scripts, commands


# Calls a script makes to measure what Redis's handling of one call costs, beyond the command's own work.
CALL_COST_CALLS = 20_000
CALL_COST_LIBRARY = """#!lua name=owlet_bench_call_cost
redis.register_function('owlet_bench_call_cost', function(keys, args)
  for _ = 1, tonumber(args[1]) do redis.call('HGET', args[2], 'f') end
  return 1
end)"""


def call_cost_us(r, key: str) -> float:
    """What a script's call of a command costs Redis beyond the command's own work, in a warm loop: turning its
    arguments into a command, running it through Redis's call path (statistics, latency histograms), and its reply
    back into Lua. ``key``: a hash of the probe's prefix, removed after."""
    r.hset(key, "f", "v")
    r.function_load(CALL_COST_LIBRARY, replace=True)
    r.config_resetstat()
    r.fcall("owlet_bench_call_cost", 0, CALL_COST_CALLS, key)
    stats = r.info("commandstats")
    r.delete(key)
    r.function_delete("owlet_bench_call_cost")
    return (int(stats["cmdstat_fcall"]["usec"]) - int(stats["cmdstat_hget"]["usec"])) / CALL_COST_CALLS


def shipped_run(url: str, args, r) -> dict:
    """The steps part with the library as it ships: per turn, Redis's CPU, its time in the scripts and the commands'
    own time (``script_usec``), the commands, and what a script's call costs beyond its command."""
    measured: dict = {}
    # the probe resets Redis's statistics as its measured turns begin; read as they end (before its purge)
    plain = steps_run(url, args, None, lambda c: measured.update(usec=script_usec(c)))
    scripts_us, commands_us = measured["usec"]
    return {"scripts_us": scripts_us / args.turns, "commands_us": commands_us / args.turns,
            "redis_us": plain["cpu_us_per_turn"], "cmds": plain["cmds_per_turn"],
            "call_cost_us": call_cost_us(r, "owlet-lua-profile-call-cost")}


def profiled_run(url: str, args, r, lib: str, text: str) -> tuple[dict, float, float, float]:
    """The steps part with every helper wrapped (``profiled_library``), after calibrating the wrapping: (the profile,
    its cost inside a call and around it, and the run's time in the scripts per turn)."""
    from worker.queue import scripts

    measured: dict = {}
    original = scripts.library
    scripts.library = lambda: (lib, text)
    try:
        r.function_load(text, replace=True)
        inside, around = calibrate(r, lib)
        steps_run(url, args, lambda c: read_profile(c, lib), lambda c: measured.update(usec=script_usec(c)))
        profile = read_profile(r, lib)
    finally:
        scripts.library = original
    return profile, inside, around, measured["usec"][0] / args.turns


def main(argv=None) -> None:
    import redis

    from bench.queue_scale import private_redis

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=3000, help="turns measured in each run")
    ap.add_argument("--rows", type=int, default=64, help="questions in flight on the one worker")
    ap.add_argument("--conversation-turns", type=int, default=1,
                    help="questions a visitor asks in one conversation before a new one (1: first questions only)")
    ap.add_argument("--top", type=int, default=25, help="helpers shown, by own time")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each kind, alternating; the least disturbed of each is reported (its scripts' time "
                         "the smallest: Redis times a script by the clock, so a run preempted midway reads longer)")
    add_quick_flag(ap)
    args = parse_with_quick(ap, argv, {"turns": 40, "rows": 8, "repeats": 3})

    with tempfile.TemporaryDirectory(prefix="owlet-lua-profile-") as work, private_redis(Path(work)) as url:
        r = redis.Redis.from_url(url)
        lib, text = profiled_library()
        shipped_runs, profiled_runs = [], []
        for _ in range(max(1, args.repeats)):
            shipped_runs.append(shipped_run(url, args, r))
            profiled_runs.append(profiled_run(url, args, r, lib, text))
        shipped = min(shipped_runs, key=lambda run: run["scripts_us"])
        profile, inside, around, _ = min(profiled_runs, key=lambda run: run[3])

    turns = profile["script finish"][1]  # one a turn
    own = {}
    for name, (total, calls, callees, callee_calls) in profile.items():
        own[name] = (max(0.0, total - callees - calls * inside - callee_calls * around) / turns, calls / turns)
    ranked = sorted(own.items(), key=lambda kv: -kv[1][0])
    own_sum = sum(v[0] for v in own.values())
    print(f"machine: {cpu_description()}; Redis of its own; one call at a time")
    print(f"steady state: {args.rows} of {args.rows + 8} looping visitors in flight, {args.turns} turns measured, "
          f"{args.conversation_turns} question(s) per conversation; the least disturbed of {max(1, args.repeats)} "
          f"run(s) of each kind")
    print(f"as shipped: Redis CPU {shipped['redis_us']:.1f} us a turn, of which in the scripts "
          f"{shipped['scripts_us']:.1f} us (INFO commandstats), {shipped['cmds']:.1f} commands")
    overhead = shipped["scripts_us"] - shipped["commands_us"]
    outside = shipped["redis_us"] - shipped["scripts_us"]
    calls_cost = shipped["cmds"] * shipped["call_cost_us"]
    print(f"   the commands' own work {shipped['commands_us']:.1f} us; the scripts' overhead {overhead:.1f} us (their "
          f"Lua, their arguments' decoding, and Redis's handling of each call they make: {shipped['call_cost_us']:.2f}"
          f" us a call in a warm loop, {calls_cost:.1f} us for a turn's calls); outside the scripts (the round "
          f"trips: reading requests, writing replies, waking) {outside:.1f} us.\n   With no script overhead at all, a "
          f"turn of these commands and round trips would still cost {shipped['commands_us'] + outside:.1f} us")
    print(f"profiled: own times add up to {own_sum:.1f} us a turn, "
          f"{own_sum / max(shipped['scripts_us'], 1e-9):.2f}x the scripts' time as shipped; the wrapping cost "
          f"{inside:.2f} us a call inside it and {around:.2f} us around it (taken off; what is left over counts in "
          f"each wrapped helper's own time)\n")
    print(f"{'helper':<22} {'calls/turn':>10} {'own us/turn':>12} {'us/call':>8} {'share':>6}")
    for name, (us, calls) in ranked[:args.top]:
        print(f"{name:<22} {calls:>10.2f} {us:>12.1f} {us / calls if calls else 0:>8.1f} "
              f"{us / own_sum if own_sum else 0:>6.1%}")
    result = {"cpu": cpu_description(), "turns": args.turns, "rows": args.rows, "repeats": max(1, args.repeats),
              "conversation_turns": args.conversation_turns, "redis_us_per_turn": round(shipped["redis_us"], 1),
              "scripts_us_per_turn": round(shipped["scripts_us"], 1), "cmds_per_turn": shipped["cmds"],
              "commands_us_per_turn": round(shipped["commands_us"], 1),
              "script_overhead_us_per_turn": round(overhead, 1), "outside_scripts_us_per_turn": round(outside, 1),
              "call_cost_us": round(shipped["call_cost_us"], 3),
              "floor_us_per_turn": round(shipped["commands_us"] + outside, 1),
              "commands_over_scripts": round(shipped["commands_us"] / shipped["scripts_us"], 3)
              if shipped["scripts_us"] else None,
              "profiled_own_us_per_turn": round(own_sum, 1), "timer_cost_us": round(inside + around, 2),
              "profiled_over_scripts": round(own_sum / shipped["scripts_us"], 3) if shipped["scripts_us"] else None,
              "own_us_per_turn": {name: round(us, 2) for name, (us, _) in ranked}}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
