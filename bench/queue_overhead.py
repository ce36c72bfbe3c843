"""Latency the queue path adds over calling the engine in-process, measured side by side in one run.

Alternates N jobs through ``OwletClient`` -> fair queue -> Celery worker (tiny LFM2-VL) -> Redis Stream,
with N calls to an in-process engine built from the same checkpoint and settings, and reports p50/p95 time
to first token for both. Two engines on two shared CPU cores differ by more than the queue adds, so the
added latency is measured per job: the client's time to first token minus the worker engine's own
``ttft_s`` for that same job (add_request -> first token). What is left is exactly the queue path: submit,
history, dispatch, Celery delivery, claim, payload checks, XADD and the reader's XREAD. Also reports the
per-token delivery delay (worker XADD -> client read).

    .venv/bin/python bench/queue_overhead.py [--jobs 30] [--tokens 8] [--quick]

Ends with ``RESULT {json}`` holding p50_added_ms.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from tests.redis_server import running_redis, unique_prefix  # noqa: E402
from tests.worker.worker_process import WorkerProcess, worker_env  # noqa: E402
from training.tiny_checkpoint import ensure_tiny_checkpoint  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402

PROMPT = "Describe the picture in one short sentence."


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def in_process_ttft(engine: LLMEngine, tokens: int) -> float:
    t0 = time.perf_counter()
    handle = engine.add_request([{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                                SamplingParams(max_new_tokens=tokens, ignore_eos=True))
    first = None
    for _ in handle:
        if first is None:
            first = time.perf_counter() - t0
    handle.result()
    return first


def queued_ttft(client: OwletClient, tokens: int) -> tuple[float, float, list[float]]:
    """Client-side TTFT, the worker engine's own TTFT for the same job, and per-token delivery delays."""
    conv = client.new_conversation("bench")
    t0 = time.perf_counter()
    job = client.submit_turn("bench", conv, PROMPT, sampling={"max_new_tokens": tokens, "ignore_eos": True})
    first, delays, engine_ttft = None, [], None
    for _, event in client.events(job):
        if event["type"] == "token":
            delays.append(time.time() - event["t"])
            if first is None:
                first = time.perf_counter() - t0
        elif event["type"] == "done":
            engine_ttft = event["stats"]["ttft_s"]
        elif event["type"] in ("error", "cancelled"):
            raise RuntimeError(f"job {job} ended with {event}")
    return first, engine_ttft, delays


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=8)
    args = parse_with_quick(ap, argv, dict(jobs=4, tokens=4))
    model = ensure_tiny_checkpoint("lfm2vl")
    with running_redis() as url:
        settings = Settings.from_env(redis_url=url, key_prefix=unique_prefix("bench-overhead"),
                                     group_submit_limit=10 * args.jobs + 100)
        client = OwletClient(settings=settings)
        worker = WorkerProcess(worker_env(settings, model, max_running=4), Path(tempfile.mkdtemp()), concurrency=6)
        engine = LLMEngine(EngineConfig(model=str(model), device="cpu", max_running=4)).start()
        try:
            worker.wait_ready(client)
            for _ in range(3):  # warm both paths
                in_process_ttft(engine, args.tokens)
                queued_ttft(client, args.tokens)
            direct, queued, added, delays = [], [], [], []
            for _ in range(args.jobs):  # interleaved, so machine load affects both alike
                direct.append(in_process_ttft(engine, args.tokens))
                ttft, engine_ttft, d = queued_ttft(client, args.tokens)
                queued.append(ttft)
                added.append(ttft - engine_ttft)
                delays.extend(d)
        finally:
            engine.stop()
            worker.stop()
            client.close(purge=True)
    ms = 1000.0
    rows = [("time to first token, in-process engine", direct), ("time to first token, via queue", queued),
            ("added by the queue path (per job, paired)", added),
            ("per-token delivery delay (XADD -> reader)", delays)]
    print(f"\n{args.jobs} jobs per path, {args.tokens} tokens each, interleaved; tiny LFM2-VL on CPU\n")
    print(f"{'measure':<44} {'p50 ms':>9} {'p95 ms':>9} {'n':>6}")
    for name, values in rows:
        print(f"{name:<44} {pct(values, .5) * ms:>9.2f} {pct(values, .95) * ms:>9.2f} {len(values):>6}")
    added_p50, added_p95 = pct(added, .5) * ms, pct(added, .95) * ms
    result = {"p50_added_ms": round(added_p50, 2), "p95_added_ms": round(added_p95, 2),
              "ttft_in_process_p50_ms": round(pct(direct, .5) * ms, 2),
              "ttft_queue_p50_ms": round(pct(queued, .5) * ms, 2),
              "token_delivery_p50_ms": round(pct(delays, .5) * ms, 2),
              "token_delivery_p95_ms": round(pct(delays, .95) * ms, 2), "jobs": args.jobs}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
