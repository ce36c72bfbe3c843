"""The stack's ceiling: can one real worker process deliver a GPU's token rate to looping clients?

Starts Redis (or uses a running one), one real Celery worker (threads pool, the fair queue, the claim and finish
scripts, coalesced stream writes) whose engine is the model-free stub (``bench/stub_engine.py``) at ``--rows`` decode
rows of ``--rate`` tokens a second each (defaults: 64 x 220, what one H200 decodes with LFM2-VL-1.6B), and
``--clients`` looping visitors in a process of their own (``bench/stack_clients.py``). For each answer length
(``--tokens``, default 48 and 200) the clients loop for a warm-up, then a measured window, and it reports:

- ``delivered_over_ideal``: answers delivered a second x their length, over the engine's rows x rate (1.0: not one
  row idles between jobs);
- ``jobs_per_s`` (and the ideal, rows x rate / length);
- ``ttft_p50_ms`` / ``ttft_p95_ms``: the client's submit to its first token (with more clients than rows, a turn
  also waits for a row: at the ideal rate that wait is (clients - rows) / jobs_per_s); ``ttft_written_*`` (queue
  path): submit to the first token's stream write, by the worker's clock, without the clients' lag in reading it;
- the median and 90th percentile of each stage of a turn (submit, dispatch, claim, first token, done, seen), from
  the job's own marks: where the time goes;
- ``worker_cpu_ms_per_job``: the worker process's CPU (``/proc/PID/stat``) over the window, per answer.

``--page`` puts the real page (``python -m ui``) in the path: the clients ask through its OpenAI-compatible API (one
address and key each), and it also reports the page's CPU per short turn. ``--compare VAR=VALUE,...`` runs every
length twice, the worker as shipped and with those variables (or the reverse, ``--compare-first``), side by side in
one run. On a small machine the worker, the clients, the page and Redis share the cores, so the ratios are the
figures to read, not the absolute times.

    .venv/bin/python -m bench.stack_ceiling [--rows 64] [--rate 220] [--clients 72] [--tokens 48,200]
                                            [--seconds 10] [--page] [--compare VAR=VALUE,...] [--quick]

Ends with ``RESULT {json}``: per length ``L``, ``delivered_over_ideal_L``, ``jobs_per_s_L``, ``ttft_p50_ms_L``,
``ttft_p95_ms_L``, ``worker_cpu_ms_per_job_L`` (and ``page_cpu_ms_per_turn_L`` with ``--page``), plus ``errors``;
with ``--compare`` the same keys again for the changed worker, prefixed ``alt_``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import cpu_description  # noqa: E402
from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from tests.redis_server import running_redis, unique_prefix  # noqa: E402
from tests.ui.stack import free_port  # noqa: E402
from tests.worker.worker_process import WorkerProcess  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402

QUICK = dict(rows=8, rate=220.0, clients=10, tokens="16", seconds=2.0, warm_s=1.0)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def parse_env(spec: str) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in spec.split(",") if item]
    assert all(len(p) == 2 for p in pairs), f"--compare takes VAR=VALUE,..., not {spec!r}"
    return dict(pairs)


def stack_env(url: str, prefix: str, clients: int, extra: dict[str, str], root: Path = ROOT) -> dict[str, str]:
    """The worker's (and page's, and clients') environment: limits that let ``clients`` loop (each visitor is its own
    group; the page trusts 127.0.0.1 to name them), then ``extra`` (the engine's variables, a compared setting).
    ``root``: the source tree the processes run (this checkout, or an older revision beside it)."""
    room = str(4 * clients)
    return dict(os.environ, REDIS_URL=url, OWLET_KEY_PREFIX=prefix,
                PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                # a looping client submits several turns a second, for minutes
                OWLET_GROUP_SUBMIT_LIMIT="1000000", OWLET_GLOBAL_QUEUE_CAP=str(max(200, 4 * clients)),
                # a worker starved of CPU on a busy machine must not be declared dead mid-run
                OWLET_HEARTBEAT_TTL_S="30", GRADIO_ANALYTICS_ENABLED="False",
                OWLET_UI_TRUSTED_PROXIES="127.0.0.1", OWLET_UI_MAX_THREADS=room, OWLET_UI_QUEUE_MAX_SIZE=room,
                OWLET_UI_MAX_NEW_TOKENS_CAP="1024", **extra)


def stub_env(args) -> dict[str, str]:
    """The model-free stub engine at rows x rate."""
    return {"OWLET_ENGINE_FACTORY": "bench.stub_engine:from_env", "OWLET_STUB_TOKENS_PER_S": str(args.rate),
            "OWLET_MAX_RUNNING": str(args.rows)}


def run_clients(env: dict, args, tokens: int, pids: dict[str, int], base: str | None, work: Path,
                root: Path = ROOT, on_window=None) -> dict:
    """One load run at ``tokens`` per answer; returns the clients' turns and each process's CPU over the window.
    ``on_window("start" | "end")`` runs as the window opens and closes (another reading of the window's cost)."""
    # this checkout's load, driving the client code of `root` (OWLET_BENCH_TREE)
    cmd = [sys.executable, str(ROOT / "bench" / "stack_clients.py"), "--clients", str(args.clients),
           "--tokens", str(tokens), "--warm-s", str(args.warm_s), "--seconds", str(args.seconds),
           "--label", f"t{tokens}-{time.time_ns()}-"]
    cmd += ["--via", "page", "--page-url", base] if base else ["--via", getattr(args, "via", "queue")]
    log = open(work / f"clients-{tokens}.log", "ab")
    driver = subprocess.Popen(cmd, cwd=root, env={**env, "OWLET_BENCH_TREE": str(root)}, stdout=subprocess.PIPE,
                              stderr=log, text=True)
    pids = {**pids, "clients": driver.pid}
    cpu_start, cpu_end, data, spy = {}, {}, None, None
    for line in driver.stdout:
        if line.startswith("WINDOW_START"):
            cpu_start = {name: cpu_s(pid) for name, pid in pids.items()}
            if on_window is not None:
                on_window("start")
            if args.profile:
                spy = profile(args.profile, pids["worker"], args.seconds, work / f"worker-{tokens}.raw")
        elif line.startswith("WINDOW_END"):
            cpu_end = {name: cpu_s(pid) for name, pid in pids.items()}
            if on_window is not None:
                on_window("end")
        elif line.startswith("{"):
            data = json.loads(line)
    if driver.wait(timeout=300) != 0 or data is None:
        raise RuntimeError(f"the clients' process failed; log:\n{(work / f'clients-{tokens}.log').read_text()[-3000:]}")
    data["cpu_s"] = {name: cpu_end[name] - cpu_start[name] for name in pids}
    if spy is not None:
        spy.wait(timeout=120)
        data["profile"] = work / f"worker-{tokens}.raw"
    return data


def profile(py_spy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """py-spy sampling the worker's threads on CPU over the window (not a project requirement: a path to it)."""
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))),
                             "--rate", "200", "--nonblocking", "--format", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


STAGES = (("submit -> dispatched", "t0", "dispatched"), ("dispatched -> claimed", "dispatched", "started"),
          ("claimed -> first token", "started", "token"), ("first token -> done", "token", "done"),
          ("done -> client saw it", "done", "end"))


def stages(turns: list[dict]) -> dict[str, float]:
    """Each stage of a turn, "p50/p90" milliseconds, from the job's own marks (queue path only)."""
    out = {}
    for name, a, b in STAGES:
        spans = []
        for t in turns:
            marks = {**t.get("marks", {}), "t0": t["t0"], "end": t["end"]}
            if marks.get(a) is not None and marks.get(b) is not None:
                spans.append(1000 * (marks[b] - marks[a]))
        if spans:
            out[name] = f"{pct(spans, 0.5):.1f}/{pct(spans, 0.9):.1f}"
    return out


def figures(data: dict, args, tokens: int) -> dict:
    lo, hi = data["window"]
    seconds = hi - lo
    ended = [t for t in data["turns"] if lo <= t["end"] < hi]
    good = [t for t in ended if t["error"] is None and t["tokens"] == tokens]
    started = [t for t in data["turns"] if lo <= t["t0"] < hi and t["first"] is not None]
    ttft = [1000 * (t["first"] - t["t0"]) for t in started]
    # the same by the worker's clock: submit -> first token written, without the clients' own lag in reading it
    written = [1000 * (t["marks"]["token"] - t["t0"]) for t in started if (t.get("marks") or {}).get("token")]
    jobs_per_s = len(good) / seconds
    ideal = args.rows * args.rate / tokens
    out = {"tokens": tokens, "jobs_per_s": round(jobs_per_s, 1), "ideal_jobs_per_s": round(ideal, 1),
           "delivered_over_ideal": round(jobs_per_s / ideal, 3),
           "ttft_p50_ms": round(pct(ttft, 0.5), 1), "ttft_p95_ms": round(pct(ttft, 0.95), 1),
           **({"ttft_written_p50_ms": round(pct(written, 0.5), 1), "ttft_written_p95_ms": round(pct(written, 0.95), 1)}
              if written else {}),
           "worker_cpu_ms_per_job": round(1000 * data["cpu_s"]["worker"] / max(1, len(good)), 2),
           "worker_cores": round(data["cpu_s"]["worker"] / seconds, 2),
           "clients_cores": round(data["cpu_s"]["clients"] / seconds, 2),
           "errors": sum(1 for t in data["turns"] if t["error"] is not None or
                         (t["first"] is not None and t["tokens"] != tokens)) + data["hung"]}
    out["stages_ms"] = stages(good)
    out["first_errors"] = [t["error"] or f"{t['tokens']} tokens of {tokens}" for t in data["turns"]
                           if t["error"] is not None or (t["first"] is not None and t["tokens"] != tokens)][:3]
    if data.get("profile") and data["profile"].exists():
        from bench.page_stream import top_costs

        print(f"\nworker profile, answers of {tokens} tokens (py-spy, on-CPU samples, inclusive; raw: {data['profile']}):")
        for frame, share in top_costs(data["profile"], 25):
            print(f"  {share * 100:5.1f}%  {frame}")
    if "page" in data["cpu_s"]:
        out["page_cpu_ms_per_turn"] = round(1000 * data["cpu_s"]["page"] / max(1, len(good)), 2)
        out["page_cores"] = round(data["cpu_s"]["page"] / seconds, 2)
    return out


def measure(url: str, args, extra: dict[str, str], work: Path, lengths: list[int], root: Path = ROOT,
            on_window=None) -> list[dict]:
    """Every answer length on one fresh worker (and page) built with ``extra`` variables, from source tree ``root``;
    ``on_window(tokens, "start" | "end")`` runs as each length's measured window opens and closes."""
    from bench.page_stream import start_page, wait_healthy

    prefix = unique_prefix("bench-ceiling")
    env = stack_env(url, prefix, args.clients, {**stub_env(args), **extra}, root)
    client = OwletClient(settings=Settings.from_env(env))
    worker = WorkerProcess(env, work, concurrency=None, cwd=root)
    page, base = None, None
    try:
        if args.page:
            port = free_port()
            page = start_page(env, port, work / f"page-{prefix}.log")
        worker.wait_ready(client)
        pids = {"worker": worker.proc.pid}
        if page is not None:
            wait_healthy(page, port, work / f"page-{prefix}.log")
            base, pids["page"] = f"http://127.0.0.1:{port}/", page.pid
        hook = (lambda tokens: None) if on_window is None else (lambda tokens: lambda edge: on_window(tokens, edge))
        return [figures(run_clients(env, args, tokens, pids, base, work, root, hook(tokens)), args, tokens)
                for tokens in lengths]
    finally:
        if page is not None:
            page.terminate()
            page.wait(timeout=20)
        worker.stop()
        client.close(purge=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--rows", type=int, default=64, help="the stub engine's decode rows")
    ap.add_argument("--rate", type=float, default=220.0, help="tokens a second per row")
    ap.add_argument("--clients", type=int, default=72)
    ap.add_argument("--tokens", default="48,200", help="answer lengths, comma separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="the measured window per length")
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--page", action="store_true", help="the clients ask through the page's API")
    ap.add_argument("--profile", metavar="PY_SPY", help="path to a py-spy binary: sample the worker in each window")
    ap.add_argument("--compare", default="", help="VAR=VALUE,...: also run a worker with these variables")
    ap.add_argument("--compare-first", action="store_true", help="run the --compare worker first")
    args = parse_with_quick(ap, argv, QUICK)
    lengths = [int(x) for x in args.tokens.split(",")]
    work = Path(tempfile.mkdtemp(prefix="owlet-ceiling-"))
    alt = parse_env(args.compare)
    variants = [("as shipped", {}, "")] + ([(args.compare, alt, "alt_")] if alt else [])
    if args.compare_first:
        variants.reverse()
    results: dict[str, list[dict]] = {}
    with running_redis() as url:
        for name, extra, _ in variants:
            results[name] = measure(url, args, extra, work, lengths)
    report(args, variants, results)


def report(args, variants, results) -> None:
    where = "the page's API" if args.page else "the fair queue (OwletClient)"
    print(f"\none worker, stub engine at {args.rows} rows x {args.rate:g} tokens/s; {args.clients} looping clients "
          f"through {where}; {args.seconds:g} s measured per length after {args.warm_s:g} s\n"
          f"machine: {cpu_description()}, shared by the worker, the clients, Redis"
          f"{' and the page' if args.page else ''} (and by other work on it: read the ratios)\n")
    cols = ["jobs_per_s", "ideal_jobs_per_s", "delivered_over_ideal", "ttft_p50_ms", "ttft_p95_ms",
            *([] if args.page else ["ttft_written_p50_ms", "ttft_written_p95_ms"]),
            "worker_cpu_ms_per_job", "worker_cores", "clients_cores", "errors"] + (["page_cpu_ms_per_turn", "page_cores"]
                                                                   if args.page else [])
    print(f"{'worker':<28} {'tokens':>6} " + " ".join(f"{c:>{max(9, len(c))}}" for c in cols))
    result = {"rows": args.rows, "rate": args.rate, "clients": args.clients, "page": args.page,
              "cpu": cpu_description(), "errors": 0}
    for name, _, key_prefix in variants:
        for row in results[name]:
            print(f"{name[:28]:<28} {row['tokens']:>6} " +
                  " ".join(f"{row.get(c, ''):>{max(9, len(c))}}" for c in cols))
            for c in cols:
                if c != "errors" and c in row:
                    result[f"{key_prefix}{c}_{row['tokens']}"] = row[c]
            result["errors"] += row["errors"]
        if key_prefix:
            result["alt_env"] = name
    for name, _, _ in variants:
        for row in results[name]:
            if row.get("stages_ms"):
                print(f"stages, p50/p90 ms ({name[:28]}, {row['tokens']} tokens): " +
                      "; ".join(f"{k} {v}" for k, v in row["stages_ms"].items()))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
