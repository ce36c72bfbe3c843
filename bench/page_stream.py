"""What one page process spends per streamed update and per short turn, with a model-free worker behind it.

Starts Redis (or uses a running one), a real Celery worker whose engine is ``bench.stub_engine`` (tokens at a
fixed rate, no model), and the real page (``python -m ui``). N ``gradio_client`` users in a separate process
(``bench.page_users``) first ask short questions, then all stream one answer of T tokens at once. Only the page
process's CPU is counted (``/proc/PID/stat``), so the figures are the page's alone.

    .venv/bin/python -m bench.page_stream [--users 64] [--tokens 200] [--rate 40] [--short-turns 4]
                                          [--profile PATH_TO_PY_SPY] [--quick]

``streams_per_core`` is the streams measured at once divided by the cores the page used meanwhile (it holds
only when every stream got at least 5 updates a second). With ``--profile`` py-spy samples the page during
the streams and the top costs are printed. ``--quick`` runs 8 users, one short turn each and answers of 60
tokens: seconds, to check the benchmark runs. Ends with ``RESULT {json}``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from bench.shared_address import shared_address_env  # noqa: E402
from tests.redis_server import running_redis, unique_prefix  # noqa: E402
from tests.ui.stack import free_port, make_image  # noqa: E402
from tests.worker.worker_process import WorkerProcess  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402

TARGETS = {"cpu_ms_per_update": 2.0, "cpu_ms_per_short_turn": 40.0, "streams_per_core": 64,
           "min_updates_per_s": 5.0, "token_to_client_p95_ms": 250.0}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def start_page(env: dict, port: int, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "wb")
    return subprocess.Popen([sys.executable, "-m", "ui", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(page: subprocess.Popen, port: int, log_path: Path) -> None:
    """Wait until the page answers /healthz with 200 (Redis reachable and a worker alive)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if page.poll() is not None:
            raise RuntimeError(f"the page exited; log:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    page.kill()
    raise RuntimeError("the page did not become healthy in 90 s")


def profile(py_spy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                             "--nonblocking", "--gil", "--format", "raw", "-o", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def top_costs(raw: Path, n: int = 15) -> list[tuple[str, float]]:
    """Inclusive share of samples per function from py-spy's collapsed stacks (idle waits left out)."""
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        leaf = frames[-1]
        if any(idle in leaf for idle in ("select (", "wait (", "_worker (", "epoll", "sleep", "poll (")):
            continue
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    return [(frame, c / total) for frame, c in inclusive.most_common(n)] if total else []


# More users than the page lets one address hold uploads, events or decodes at once: a quick run still fails
# if a per-address limit is left in place (bench.shared_address).
QUICK = dict(users=8, tokens=60, short_turns=1, idle_s=0.5)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rate", type=float, default=40.0, help="tokens per second per answer (the stub engine)")
    ap.add_argument("--short-turns", type=int, default=4)
    ap.add_argument("--idle-s", type=float, default=2.0, help="how long the page's idle cost is measured")
    ap.add_argument("--profile", metavar="PY_SPY", help="path to a py-spy binary: sample the page during a phase")
    ap.add_argument("--profile-phase", choices=("stream", "short", "idle"), default="stream")
    args = parse_with_quick(ap, argv, QUICK)
    work = Path(tempfile.mkdtemp(prefix="owlet-page-bench-"))
    image = make_image(work / "shape.png")
    with running_redis() as url:
        prefix = unique_prefix("bench-page")
        settings = Settings.from_env(redis_url=url, key_prefix=prefix)
        env = dict(os.environ, REDIS_URL=url, OWLET_KEY_PREFIX=prefix,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   OWLET_ENGINE_FACTORY="bench.stub_engine:from_env", OWLET_STUB_TOKENS_PER_S=str(args.rate),
                   OWLET_MAX_RUNNING=str(args.users), OWLET_USER_QUEUE_CAP="8", GRADIO_ANALYTICS_ENABLED="False",
                   # a stub worker starved of CPU on a busy machine must not be declared dead mid-answer
                   OWLET_HEARTBEAT_TTL_S="60",
                   OWLET_UI_MAX_NEW_TOKENS_CAP=str(max(1024, args.tokens)),
                   OWLET_UI_MAX_THREADS=str(max(64, 2 * args.users)),
                   # Every simulated user comes from 127.0.0.1: give that address what N addresses would get
                   # (tests/security and bench/abuse.py measure the limits), so this measures streaming alone.
                   **shared_address_env(args.users))
        client = OwletClient(settings=settings)
        worker = WorkerProcess(env, work, concurrency=args.users + 4)
        page = None
        spy = None
        try:
            port = free_port()
            page = start_page(env, port, work / "page.log")  # starts while the worker does: both take seconds
            worker.wait_ready(client)
            wait_healthy(page, port, work / "page.log")
            driver = subprocess.Popen(
                [sys.executable, "-m", "bench.page_users", "--url", f"http://127.0.0.1:{port}/",
                 "--page-pid", str(page.pid), "--users", str(args.users), "--tokens", str(args.tokens),
                 "--short-turns", str(args.short_turns), "--idle-s", str(args.idle_s), "--image", str(image)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=open(work / "users.log", "wb"), text=True)
            lines = []
            for line in driver.stdout:  # the users' process says when the streams start, then prints its JSON
                lines.append(line)
                if args.profile and line.startswith("STREAMS") and args.profile_phase == "stream":
                    spy = profile(args.profile, page.pid, args.tokens / args.rate + 2, work / "profile.txt")
                if args.profile and line.startswith("IDLE") and args.profile_phase == "idle":
                    spy = profile(args.profile, page.pid, 2, work / "profile.txt")
                if args.profile and line.startswith("SHORT") and args.profile_phase == "short":
                    spy = profile(args.profile, page.pid, 8, work / "profile.txt")
            if driver.wait(timeout=1200) != 0:
                raise RuntimeError(f"the users' process failed; log:\n{(work / 'users.log').read_text()[-4000:]}")
            data = json.loads(lines[-1])
            (work / "users.json").write_text(lines[-1])
            stored = stored_answers(client)
        finally:
            if spy is not None:
                spy.wait(timeout=120)
            if page is not None:
                page.terminate()
                page.wait(timeout=20)
            worker.stop()
            client.close(purge=True)
    report(args, data, stored, work / "profile.txt" if args.profile else None)


def stored_answers(client: OwletClient) -> set[str]:
    """Every assistant turn in the bench's conversations: what the worker finished with."""
    answers = set()
    for key in client.r.scan_iter(match=client.keys.prefix + "conv:*:turns", count=1000):
        for raw in client.r.lrange(key, 0, -1):
            turn = json.loads(raw)
            if turn.get("role") == "assistant":
                answers.add(turn.get("text") or "")
    return answers


def report(args, data: dict, stored: set[str], profile_path: Path | None) -> None:
    short, stream = data["short"], data["stream"]
    users = stream["users"]
    updates = sum(u["updates"] for u in users)
    latencies = [ms for u in users for ms in u["latencies_ms"]]
    # After each answer's first second: the start, when every user's turn is admitted at once, left out.
    steady = [ms for u in users for ms in u["latencies_ms"][int(args.rate):]]
    rates = [u["updates_per_s"] for u in users]
    cores = stream["cpu_s"] / stream["wall_s"]
    complete = sum(1 for u in users if u["final"] in stored and len(u["final"].split()) == args.tokens)
    result = {
        "users": args.users, "tokens": args.tokens, "tokens_per_s": args.rate,
        "cpu_ms_per_update": round(1000 * stream["cpu_s"] / max(1, updates), 3),
        "cpu_ms_per_stream_turn": round(1000 * stream["cpu_s"] / args.users, 1),
        "cpu_ms_per_short_turn": round(1000 * short["cpu_s"] / short["turns"], 1),
        "page_cores_while_streaming": round(cores, 3), "page_cores_idle": round(data["idle_cores"], 3),
        "streams_per_core": round(args.users / cores, 1) if cores > 0 else None,
        "updates_per_s_per_user_p50": round(statistics.median(rates), 2),
        "updates_per_s_per_user_min": round(min(rates), 2),
        "token_to_client_p50_ms": round(pct(latencies, 0.5), 1),
        "token_to_client_p95_ms": round(pct(latencies, 0.95), 1),
        "token_to_client_p95_after_first_second_ms": round(pct(steady, 0.95), 1),
        "bytes_per_update_p50": pct(stream["update_bytes"], 0.5),
        "final_text_identical": f"{complete}/{args.users}",
        "stream_wall_s": round(stream["wall_s"], 2), "short_turns": short["turns"],
        "cpu": cpu_description(),
    }
    print(f"\npage process alone; {args.users} gradio_client users; stub worker at {args.rate:g} tokens/s; "
          f"answers of {args.tokens} tokens\nmachine: {result['cpu']}, shared by the page, the stub worker, "
          f"Redis and the clients\n")
    rows = [("CPU per streamed update (ms)", result["cpu_ms_per_update"], f"<= {TARGETS['cpu_ms_per_update']}"),
            ("CPU per streamed answer (ms)", result["cpu_ms_per_stream_turn"], ""),
            ("CPU per short turn (ms)", result["cpu_ms_per_short_turn"], f"<= {TARGETS['cpu_ms_per_short_turn']}"),
            ("page cores used while streaming", result["page_cores_while_streaming"], ""),
            ("page cores used while idle", result["page_cores_idle"], ""),
            ("streams per core", result["streams_per_core"], f">= {TARGETS['streams_per_core']}"),
            ("updates/s per user, median", result["updates_per_s_per_user_p50"], ""),
            ("updates/s per user, slowest", result["updates_per_s_per_user_min"], f">= {TARGETS['min_updates_per_s']}"),
            ("token -> client p50 (ms)", result["token_to_client_p50_ms"], ""),
            ("token -> client p95 (ms)", result["token_to_client_p95_ms"], f"<= {TARGETS['token_to_client_p95_ms']}"),
            ("  the same after each answer's first second", result["token_to_client_p95_after_first_second_ms"], ""),
            ("bytes per update, median", result["bytes_per_update_p50"], ""),
            ("final text identical to the worker's", result["final_text_identical"], f"{args.users}/{args.users}")]
    print(f"{'measure':<40} {'value':>10}   target")
    for name, value, target in rows:
        print(f"{name:<40} {value!s:>10}   {target}")
    if profile_path is not None and profile_path.exists():
        print(f"\npage profile, {args.profile_phase} phase (py-spy --gil, inclusive share of samples; "
              f"raw: {profile_path}):")
        for frame, share in top_costs(profile_path):
            print(f"  {share * 100:5.1f}%  {frame}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
