"""Abuse: one address floods the queue with 50 made-up identities while 4 honest users at other addresses ask.

Three queue policies run side by side on the same real Celery worker (tiny LFM2-VL model) and Redis:

- ``owlet``: round robin across client addresses, then across identities within an address (what ships);
- ``per-identity``: round robin across identities only (what a forger defeats: 50 ids, 50 shares);
- ``fifo``: one shared first-come queue (the baseline).

The per-address caps are raised here so that all 50 flood jobs really wait in the queue (the worst case for
ordering); with the shipped caps most of the flood would be refused outright, which the table also counts.
Reports each honest user's queue wait (submit -> started) over one job's median service time.

    .venv/bin/python bench/abuse.py [--flood 50] [--tokens 16] [--slots 4]

Ends with ``RESULT {json}`` holding honest_wait_over_service_max (owlet) and the baselines'.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.queue_worker import job_times, queue_worker, warm_up  # noqa: E402
from tests.redis_server import running_redis, unique_prefix  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402
from worker.errors import OwletError  # noqa: E402

ATTACKER = "addr:203.0.113.66"
HONEST = tuple(f"addr:198.51.100.{i}" for i in range(1, 5))
MODES = ("owlet", "per-identity", "fifo")


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


def run_mode(redis_url: str, mode: str, args, log_dir: Path) -> dict:
    with queue_worker(redis_url, "bench-abuse", args.flood, args.slots, log_dir, fifo=mode == "fifo") as client:
        sampling = {"max_new_tokens": args.tokens, "ignore_eos": True}
        warm_up(client, args.slots, sampling)
        jobs: list[tuple[str, str, float]] = []  # (who, job, submitted_at)
        for i in range(args.flood):
            user = f"anon:forged{i}"
            sub = client.submit(user, None, f"Flood {i}.", sampling=sampling, group=group_of(mode, user, ATTACKER))
            jobs.append(("attacker", sub.job, time.time()))
        for i, address in enumerate(HONEST):
            user = f"anon:honest{i}"
            sub = client.submit(user, None, "One question.", sampling=sampling, group=group_of(mode, user, address))
            jobs.append((f"honest{i + 1}", sub.job, time.time()))
        rows = [{"who": who, **job_times(client, job, submitted)} for who, job, submitted in jobs]
    service = statistics.median(r["service_s"] for r in rows)
    honest = {r["who"]: r["wait_s"] for r in rows if r["who"] != "attacker"}
    attacker = [r["wait_s"] for r in rows if r["who"] == "attacker"]
    return {"service_s": service, "honest": honest, "attacker_median_wait_s": statistics.median(attacker),
            "honest_wait_over_service_max": max(honest.values()) / service}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=50, help="jobs from the attacker, each under a new identity")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4, help="engine max_running of the worker")
    args = ap.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="owlet-bench-abuse-"))
    with running_redis() as url:
        results = {mode: run_mode(url, mode, args, log_dir) for mode in MODES}
        admitted = shipped_cap_admits(url, args.flood)
    print(f"\n1 address floods {args.flood} jobs under {args.flood} identities, then 4 honest users at 4 other "
          f"addresses ask 1 question each; {args.slots} engine slots; {args.tokens} tokens per job")
    print("honest queue wait / one job's median service time (lower is better):\n")
    print(f"{'who':<10}" + "".join(f"{m:>16}" for m in MODES))
    for who in (f"honest{i}" for i in range(1, 5)):
        print(f"{who:<10}" + "".join(f"{results[m]['honest'][who] / results[m]['service_s']:>16.2f}" for m in MODES))
    print(f"{'worst':<10}" + "".join(f"{results[m]['honest_wait_over_service_max']:>16.2f}" for m in MODES))
    print(f"{'service s':<10}" + "".join(f"{results[m]['service_s']:>16.3f}" for m in MODES))
    print(f"{'attacker*':<10}" + "".join(f"{results[m]['attacker_median_wait_s'] / results[m]['service_s']:>16.2f}"
                                         for m in MODES))
    print("* attacker: median wait of its jobs over the service time")
    print(f"with the shipped per-address cap, {admitted} of the {args.flood} flood jobs would have been admitted")
    result = {"honest_wait_over_service_max": round(results["owlet"]["honest_wait_over_service_max"], 3),
              "per_identity_honest_wait_over_service_max":
                  round(results["per-identity"]["honest_wait_over_service_max"], 3),
              "fifo_honest_wait_over_service_max": round(results["fifo"]["honest_wait_over_service_max"], 3),
              "flood_admitted_with_shipped_cap": admitted, "flood": args.flood, "slots": args.slots,
              "tokens": args.tokens, "service_s": {m: round(results[m]["service_s"], 4) for m in MODES}}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
