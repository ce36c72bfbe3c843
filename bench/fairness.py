"""Fairness under a flood: Owlet's round-robin dispatcher against a plain FIFO queue, in one run.

One heavy user submits 50 jobs, then 4 light users submit 1 job each. Both modes run the same real
Celery worker (tiny LFM2-VL model, 4 decode rows, the shipped thread count) on the same Redis. Reports every
user's queue wait (submit -> started), time to first token and completion time (submit -> done), relative to
one job's median service time.

    python -m bench.fairness [--quick] [--heavy-jobs 50] [--tokens 16] [--slots 4]

Ends with ``RESULT {json}`` holding light_wait_over_service_max and fifo_light_wait_over_service_max.
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

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from bench.queue_worker import job_times, queue_worker, warm_up  # noqa: E402
from tests.redis_server import running_redis  # noqa: E402

LIGHT_USERS = ("light1", "light2", "light3", "light4")


def run_mode(redis_url: str, fifo: bool, args, log_dir: Path) -> dict:
    with queue_worker(redis_url, "bench-fair", args.heavy_jobs, args.slots, log_dir, args.threads,
                      fifo=fifo) as client:
        sampling = {"max_new_tokens": args.tokens, "ignore_eos": True}
        warm_up(client, args.slots, sampling)
        jobs: list[tuple[str, str, float]] = []  # (user, job, submitted_at)
        for i in range(args.heavy_jobs):
            conv, submitted = client.new_conversation("heavy"), time.time()
            jobs.append(("heavy", client.submit_turn("heavy", conv, f"Question {i}.", sampling=sampling), submitted))
        for user in LIGHT_USERS:
            conv, submitted = client.new_conversation(user), time.time()
            jobs.append((user, client.submit_turn(user, conv, "One question.", sampling=sampling), submitted))
        rows = [{"user": user, "submitted": submitted, **job_times(client, job, submitted)}
                for user, job, submitted in jobs]
    return summarise(rows)


def summarise(rows: list[dict]) -> dict:
    service = statistics.median(r["service_s"] for r in rows)
    heavy = [r for r in rows if r["user"] == "heavy"]
    per_user = {"heavy": {"wait_s": statistics.median(r["wait_s"] for r in heavy),
                          "wait_max_s": max(r["wait_s"] for r in heavy),
                          "completion_s": max(r["completion_s"] for r in heavy)}}
    for r in rows:
        if r["user"] != "heavy":
            # heavy jobs that started while this light job waited: 0 means nobody overtook it
            overtaken = sum(r["submitted"] < h["started"] < r["started"] for h in heavy)
            per_user[r["user"]] = {"wait_s": r["wait_s"], "wait_max_s": r["wait_s"], "completion_s": r["completion_s"],
                                   "first_token_s": r["first_token_s"], "overtaken_by": overtaken}
    light_max = max(per_user[u]["wait_s"] for u in LIGHT_USERS)
    first_token_max = max(per_user[u]["first_token_s"] for u in LIGHT_USERS)
    return {"service_s": service, "users": per_user, "light_wait_over_service_max": light_max / service,
            "light_first_token_over_service_max": first_token_max / service,
            "light_overtaken_max": max(per_user[u]["overtaken_by"] for u in LIGHT_USERS)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--heavy-jobs", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4, help="engine max_running of the worker")
    ap.add_argument("--threads", type=int, default=None, help="the worker's Celery threads (default: shipped)")
    args = parse_with_quick(ap, argv, {"heavy_jobs": 12, "tokens": 8})
    log_dir = Path(tempfile.mkdtemp(prefix="owlet-bench-"))
    with running_redis() as url:
        fair = run_mode(url, False, args, log_dir)
        fifo = run_mode(url, True, args, log_dir)
    print(f"\nmachine: {cpu_description()} | tiny LFM2-VL, fp32 CPU | worker: {args.slots} decode rows, "
          f"{args.threads or 'shipped'} threads")
    print(f"{args.heavy_jobs} heavy jobs then 1 job from each of 4 light users; {args.tokens} tokens per job")
    print(f"median service time: fair {fair['service_s']:.3f} s, fifo {fifo['service_s']:.3f} s\n")
    print(f"{'user':<8} {'fair wait s':>12} {'fifo wait s':>12} {'fair wait/svc':>14} {'fifo wait/svc':>14} "
          f"{'fair done s':>12} {'fifo done s':>12} {'fair overtaken':>15} {'fifo overtaken':>15}")
    for user in ("heavy", *LIGHT_USERS):
        a, b = fair["users"][user], fifo["users"][user]
        label = "heavy*" if user == "heavy" else user
        print(f"{label:<8} {a['wait_s']:>12.3f} {b['wait_s']:>12.3f} {a['wait_s'] / fair['service_s']:>14.2f} "
              f"{b['wait_s'] / fifo['service_s']:>14.2f} {a['completion_s']:>12.3f} {b['completion_s']:>12.3f} "
              f"{a.get('overtaken_by', '-'):>15} {b.get('overtaken_by', '-'):>15}")
    print(f"light users' worst time to first token / service: fair "
          f"{fair['light_first_token_over_service_max']:.2f}, fifo {fifo['light_first_token_over_service_max']:.2f}")
    print("* heavy: median wait over its jobs; done = when its last job finished")
    print("overtaken = heavy jobs that started while the light job waited. A light job's wait is the rest of the\n"
          "batch already running when it arrived, so on a shared, loaded CPU its ratio to the median service\n"
          "time is noisy; the overtaken count is not.")
    result = {"light_wait_over_service_max": round(fair["light_wait_over_service_max"], 3),
              "fifo_light_wait_over_service_max": round(fifo["light_wait_over_service_max"], 3),
              "light_first_token_over_service_max": round(fair["light_first_token_over_service_max"], 3),
              "fifo_light_first_token_over_service_max": round(fifo["light_first_token_over_service_max"], 3),
              "light_overtaken_max": fair["light_overtaken_max"],
              "fifo_light_overtaken_max": fifo["light_overtaken_max"],
              "service_s_fair": round(fair["service_s"], 4), "service_s_fifo": round(fifo["service_s"], 4),
              "heavy_jobs": args.heavy_jobs, "slots": args.slots, "tokens": args.tokens}
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
