"""Abuse: floods and crowds against honest users, on a real Celery worker (tiny LFM2-VL) and Redis, in one run.

Three scenes, each a table; every worker runs the shipped thread count (the engine's max_active + 2) and 4 decode
rows (``--slots``), so it holds 16 answers: 4 in rows, the rest paused or waiting inside the engine.

1. **Flood** (short answers): one address submits ``--flood`` jobs under as many made-up identities, then 4 honest
   users at 4 other addresses ask one question each. Three queue policies side by side:

   - ``owlet``: round robin across client addresses, then across identities within an address (what ships);
   - ``per-identity``: round robin across identities only (what a forger defeats: 50 ids, 50 shares);
   - ``fifo``: one shared first-come queue (the baseline).

   The per-address caps are raised so that the whole flood really waits in the queue (the worst case for
   ordering); with the shipped caps most of it would be refused, which the table also counts.
2. **Long flood**: the flooding address's answers are longer than a time slice (``--long-tokens``), so they could
   hold every decode row for a whole answer; the honest users still ask short questions. ``owlet`` against the same
   worker with time slicing off: with slicing a newcomer gets a row after one slice, not after a whole answer.
3. **Crowd**: ``--crowd`` addresses each loop one long answer at a time (``--crowd-tokens``, re-asking the moment
   it ends), so none has anything in flight while it waits and the line is long. Once every crowd address has been
   answered (so each has used the workers), 4 visitors from new addresses ask a question and a follow-up, and a
   "heavy" visitor asks a long answer and then a short one (its usage sets it back, but at most to the end of the
   line).

4. **API flood**: scene 1 through the real page's OpenAI-compatible API (``bench/abuse_api.py``): one address
   fetches ``--flood`` keys and asks one question with each, then 4 honest API users at 4 other addresses ask one
   each. The page groups keys by address, so the flood is one client.

Figures are each honest user's queue wait (submit -> a worker takes the job) and time to first token, over one
flood job's median service time (started -> done) in scenes 1, 2 and 4, and over a crowd answer's in scene 3.

    python -m bench.abuse [--quick] [--flood 50] [--tokens 16] [--long-tokens 256] [--crowd 100] [--crowd-tokens 1024]
                          [--visitor-gap-s 1]

Ends with ``RESULT {json}``: ``honest_wait_over_service_max`` (scene 1, owlet; target <= 2),
``long_first_token_over_service_max`` (scene 2, owlet) and its ``..._no_slicing`` baseline, the crowd's
``crowd_visitor_first_token_s_max`` / ``..._over_service`` and ``crowd_heavy_wait_over_crowd_wait``, and the API
flood's ``api_honest_wait_over_service_max`` (target <= 2) with ``api_flood_groups`` (1: every key one client).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.abuse_api import run_api_flood  # noqa: E402
from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from bench.queue_worker import WorkerSpec, Workers, job_times, warm_up  # noqa: E402
from tests.redis_server import running_redis, unique_prefix  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402
from worker.errors import OwletError  # noqa: E402

ATTACKER = "addr:203.0.113.66"
HONEST = tuple(f"addr:198.51.100.{i}" for i in range(1, 5))
FLOOD_MODES = ("owlet", "per-identity", "fifo")
SHORT = 16  # tokens of an honest user's answer in scenes 2 and 3


def group_of(mode: str, user: str, address: str) -> str:
    return user if mode == "per-identity" else address


def shipped_cap_admits(redis_url: str, flood: int) -> int:
    """How many of the flood the default per-address cap admits (no worker: nothing is dispatched)."""
    client = OwletClient(settings=Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("bench-abuse-cap")))
    admitted = 0
    try:
        for i in range(flood):
            try:
                client.submit(f"anon:forged{i}", None, "flood", group=ATTACKER)
                admitted += 1
            except OwletError:
                pass
    finally:
        client.close(purge=True)
    return admitted


def sampling(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "ignore_eos": True}


def flood_and_honest(client: OwletClient, mode: str, flood: int, flood_tokens: int, honest_tokens: int) -> dict:
    """One address floods, then the honest users ask; each honest user's wait and first token over the flood's
    median service time."""
    jobs: list[tuple[str, str, float]] = []  # (who, job, submitted_at)
    for i in range(flood):
        user, submitted = f"anon:forged{i}", time.time()
        sub = client.submit(user, None, f"Flood {i}.", sampling=sampling(flood_tokens),
                            group=group_of(mode, user, ATTACKER))
        jobs.append(("attacker", sub.job, submitted))
    for i, address in enumerate(HONEST):
        user, submitted = f"anon:honest{i}", time.time()
        sub = client.submit(user, None, "One question.", sampling=sampling(honest_tokens),
                            group=group_of(mode, user, address))
        jobs.append((f"honest{i + 1}", sub.job, submitted))
    rows = [{"who": who, **job_times(client, job, submitted)} for who, job, submitted in jobs]
    attacker = [r for r in rows if r["who"] == "attacker"]
    service = statistics.median(r["service_s"] for r in attacker)
    honest = {r["who"]: r for r in rows if r["who"] != "attacker"}
    return {"service_s": service,
            "wait": {who: r["wait_s"] / service for who, r in honest.items()},
            "first_token": {who: r["first_token_s"] / service for who, r in honest.items()},
            "attacker_wait": statistics.median(r["wait_s"] for r in attacker) / service}


def scene_workers(args) -> dict[str, WorkerSpec]:
    """Each scene's worker, by scene."""
    specs = {f"flood {mode}": WorkerSpec("bench-abuse", args.flood, args.slots, args.threads,
                                         settings={"fifo": mode == "fifo"}) for mode in FLOOD_MODES}
    specs["long flood"] = WorkerSpec("bench-abuse-long", args.long_flood, args.slots, args.threads)
    specs["long flood, no slicing"] = WorkerSpec("bench-abuse-long", args.long_flood, args.slots, args.threads,
                                                 engine_env={"OWLET_TIME_SLICE_TOKENS": "0"})
    specs["crowd"] = WorkerSpec("bench-abuse-crowd", args.crowd, args.slots, args.threads)
    specs["api flood"] = WorkerSpec("bench-abuse-api", args.flood, args.slots, args.threads)
    return specs


def run_flood(workers: Workers, mode: str, args) -> dict:
    with workers.use(f"flood {mode}") as client:
        warm_up(client, args.slots, sampling(args.tokens))
        return flood_and_honest(client, mode, args.flood, args.tokens, args.tokens)


def run_long_flood(workers: Workers, slicing: bool, args) -> dict:
    with workers.use("long flood" if slicing else "long flood, no slicing") as client:
        warm_up(client, args.slots, sampling(args.tokens))
        return flood_and_honest(client, "owlet", args.long_flood, args.long_tokens, SHORT)


class Crowd:
    """``n`` addresses, each looping one answer of ``tokens`` at a time, each from its own client."""

    def __init__(self, settings: Settings, n: int, tokens: int):
        self.settings, self.n, self.tokens = settings, n, tokens
        self.answered = [0] * n
        self.rows: list[dict] = []  # job_times of every crowd answer
        self.errors = 0
        self.error_messages: list[str] = []  # the first few, printed with the scene: an error is never anonymous
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)]

    def __enter__(self) -> "Crowd":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=600)

    def _loop(self, i: int) -> None:
        client = OwletClient(settings=self.settings)
        try:
            while not self._stop.is_set():
                submitted = time.time()
                try:
                    job = client.submit(f"anon:crowd{i}", None, f"Crowd {i}.", sampling=sampling(self.tokens),
                                        group=f"addr:10.0.{i // 250}.{i % 250 + 1}").job
                    row = job_times(client, job, submitted)
                except (OwletError, AssertionError) as exc:
                    self.errors += 1
                    if len(self.error_messages) < 5:
                        self.error_messages.append(f"crowd{i}: {type(exc).__name__}: {exc}"[:600])
                    time.sleep(0.5)
                    continue
                self.rows.append(row)
                self.answered[i] += 1
        finally:
            client.close()

    def wait_until_everyone_answered(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while min(self.answered) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the crowd did not get every address answered in {timeout_s:.0f} s "
                                   f"({sum(a > 0 for a in self.answered)} of {self.n})")
            time.sleep(0.2)


def ask(client: OwletClient, user: str, address: str, tokens: int) -> dict:
    submitted = time.time()
    job = client.submit(user, None, "A question.", sampling=sampling(tokens), group=address).job
    return job_times(client, job, submitted)


def run_crowd(workers: Workers, args) -> dict:
    with workers.use("crowd") as client:
        warm_up(client, args.slots, sampling(args.tokens))
        with Crowd(client.settings, args.crowd, args.crowd_tokens) as crowd:
            crowd.wait_until_everyone_answered(timeout_s=60 + 2 * args.crowd * args.crowd_tokens / 100)
            since = time.time()
            visitors = []
            for v in range(4):
                address, user = f"addr:192.0.2.{v + 1}", f"anon:visitor{v}"
                first = ask(client, user, address, SHORT)
                follow_up = ask(client, user, address, SHORT)
                visitors.append((first, follow_up))
                time.sleep(args.visitor_gap_s)
            heavy_long = ask(client, "anon:heavy", "addr:192.0.2.99", args.crowd_tokens)
            heavy = ask(client, "anon:heavy", "addr:192.0.2.99", SHORT)
            during = [r for r in crowd.rows if r["started"] >= since]
            errors, error_messages = crowd.errors, list(crowd.error_messages)
    everything = during or crowd.rows
    service = statistics.median(r["service_s"] for r in everything)
    crowd_wait = statistics.median(r["wait_s"] for r in everything)
    return {"service_s": service, "crowd_wait_s": crowd_wait,
            "crowd_wait_max_s": max(r["wait_s"] for r in everything), "crowd_errors": errors,
            "crowd_error_messages": error_messages,
            "visitors": visitors, "heavy_long": heavy_long, "heavy": heavy}


def print_flood_table(title: str, results: dict, figure: str) -> None:
    print(f"\n{title}")
    modes = list(results)
    print(f"{'who':<10}" + "".join(f"{m:>18}" for m in modes))
    for who in (f"honest{i}" for i in range(1, 5)):
        print(f"{who:<10}" + "".join(f"{results[m][figure][who]:>18.2f}" for m in modes))
    print(f"{'worst':<10}" + "".join(f"{max(results[m][figure].values()):>18.2f}" for m in modes))
    print(f"{'service s':<10}" + "".join(f"{results[m]['service_s']:>18.3f}" for m in modes))
    print(f"{'attacker*':<10}" + "".join(f"{results[m]['attacker_wait']:>18.2f}" for m in modes))


def print_crowd_table(crowd: dict, args) -> None:
    print(f"\n3. crowd: {args.crowd} addresses each looping {args.crowd_tokens}-token answers; crowd answer "
          f"{crowd['service_s']:.2f} s from start to end, crowd queue wait median {crowd['crowd_wait_s']:.2f} s, "
          f"max {crowd['crowd_wait_max_s']:.2f} s")
    print(f"{'visitor':<10}{'position':>10}{'wait s':>10}{'1st token s':>13}{'/ service':>11}   "
          f"{'follow-up pos':>14}{'wait s':>10}{'1st token s':>13}")
    for i, (first, follow) in enumerate(crowd["visitors"], 1):
        print(f"{'v' + str(i):<10}{first['position'] or '-':>10}{first['wait_s']:>10.2f}{first['first_token_s']:>13.2f}"
              f"{first['first_token_s'] / crowd['service_s']:>11.2f}   {follow['position'] or '-':>14}"
              f"{follow['wait_s']:>10.2f}{follow['first_token_s']:>13.2f}")
    heavy = crowd["heavy"]
    print(f"heavy visitor, after its own {args.crowd_tokens}-token answer ({crowd['heavy_long']['service_s']:.1f} s): "
          f"position {heavy['position'] or '-'}, wait {heavy['wait_s']:.2f} s, "
          f"first token {heavy['first_token_s']:.2f} s "
          f"(the crowd's median wait {crowd['crowd_wait_s']:.2f} s)")
    if crowd["crowd_errors"]:
        print(f"crowd errors: {crowd['crowd_errors']}; the first: " + " | ".join(crowd["crowd_error_messages"]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--flood", type=int, default=50, help="scene 1: jobs from the attacker, each a new identity")
    ap.add_argument("--tokens", type=int, default=16, help="scene 1: tokens per job")
    ap.add_argument("--long-flood", type=int, default=16, help="scene 2: long answers the attacker floods")
    ap.add_argument("--long-tokens", type=int, default=256, help="scene 2: tokens per flood answer (> a slice)")
    ap.add_argument("--crowd", type=int, default=100, help="scene 3: addresses looping one answer each")
    ap.add_argument("--crowd-tokens", type=int, default=1024, help="scene 3: tokens per crowd answer")
    ap.add_argument("--visitor-gap-s", type=float, default=1.0, help="scene 3: seconds between the visitors")
    ap.add_argument("--slots", type=int, default=4, help="the worker engine's decode rows (max_running)")
    ap.add_argument("--threads", type=int, default=None, help="the worker's Celery threads (default: shipped)")
    args = parse_with_quick(ap, argv, {"flood": 8, "tokens": 8, "long_flood": 8, "long_tokens": 96, "crowd": 8,
                                       "crowd_tokens": 96, "visitor_gap_s": 0.25})
    log_dir = Path(tempfile.mkdtemp(prefix="owlet-bench-abuse-"))
    # A quick run starts its seven workers at once and stops them at once (bench/queue_worker.py); a measured run
    # starts each as its scene begins, so nothing else runs beside a measured scene.
    with running_redis() as url, Workers(url, log_dir, scene_workers(args), together=args.quick) as workers:
        flood = {mode: run_flood(workers, mode, args) for mode in FLOOD_MODES}
        admitted = shipped_cap_admits(url, args.flood)
        long_flood = {"owlet": run_long_flood(workers, True, args),
                      "no time slicing": run_long_flood(workers, False, args)}
        crowd = run_crowd(workers, args)
        api = run_api_flood(workers, "api flood", args, log_dir, sampling)
    print(f"\nmachine: {cpu_description()} | tiny LFM2-VL, fp32 CPU | worker: {args.slots} decode rows, "
          f"{args.threads or 'shipped'} threads")
    print_flood_table(f"1. flood: 1 address, {args.flood} jobs under {args.flood} identities, {args.tokens} tokens "
                      "each; 4 honest users at 4 other addresses ask 1 question each.\n"
                      "honest queue wait / one flood job's median service time (lower is better):", flood, "wait")
    print_flood_table("honest time to first token / one flood job's median service time:", flood, "first_token")
    print(f"with the shipped per-address cap, {admitted} of the {args.flood} flood jobs would have been admitted")
    print_flood_table(f"2. long flood: 1 address, {args.long_flood} answers of {args.long_tokens} tokens; the honest "
                      f"users ask {SHORT}-token questions.\nhonest time to first token / one flood answer's median "
                      "service time:", long_flood, "first_token")
    print("* attacker: median queue wait of its jobs over the service time")
    print_crowd_table(crowd, args)
    print_flood_table(f"4. API flood: 1 address, {args.flood} keys asking 1 question each through /v1/chat/completions"
                      f" ({args.tokens} tokens); 4 honest API users at 4 other addresses ask 1 each.\n"
                      "honest queue wait / one flood answer's median service time:", {"owlet API": api}, "wait")
    print_flood_table("honest time to first token / one flood answer's median service time:", {"owlet API": api},
                      "first_token")
    print(f"the flood's {args.flood} keys were {api['attacker_groups']} client group(s); {api['refused']} requests "
          "refused")
    firsts = [first["first_token_s"] for first, _ in crowd["visitors"]]
    follows = [follow["first_token_s"] for _, follow in crowd["visitors"]]
    result = {
        "honest_wait_over_service_max": round(max(flood["owlet"]["wait"].values()), 3),
        "honest_first_token_over_service_max": round(max(flood["owlet"]["first_token"].values()), 3),
        "per_identity_honest_wait_over_service_max": round(max(flood["per-identity"]["wait"].values()), 3),
        "fifo_honest_wait_over_service_max": round(max(flood["fifo"]["wait"].values()), 3),
        "flood_admitted_with_shipped_cap": admitted,
        "long_first_token_over_service_max": round(max(long_flood["owlet"]["first_token"].values()), 3),
        "long_first_token_over_service_max_no_slicing":
            round(max(long_flood["no time slicing"]["first_token"].values()), 3),
        "crowd_visitor_first_token_s_max": round(max(firsts), 3),
        "crowd_visitor_first_token_over_service_max": round(max(firsts) / crowd["service_s"], 3),
        "crowd_follow_up_first_token_s_max": round(max(follows), 3),
        # (a quick run's crowd barely waits: a millisecond floor keeps the ratio finite)
        "crowd_heavy_wait_over_crowd_wait": round(crowd["heavy"]["wait_s"] / max(crowd["crowd_wait_s"], 1e-3), 3),
        "crowd_service_s": round(crowd["service_s"], 3), "crowd_wait_s": round(crowd["crowd_wait_s"], 3),
        "crowd_errors": crowd["crowd_errors"],
        "api_honest_wait_over_service_max": round(max(api["wait"].values()), 3),
        "api_honest_first_token_over_service_max": round(max(api["first_token"].values()), 3),
        "api_flood_groups": api["attacker_groups"], "api_refused": api["refused"],
        "flood": args.flood, "tokens": args.tokens, "long_flood": args.long_flood, "long_tokens": args.long_tokens,
        "crowd": args.crowd, "crowd_tokens": args.crowd_tokens, "slots": args.slots,
        "service_s": {m: round(flood[m]["service_s"], 4) for m in FLOOD_MODES},
    }
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
