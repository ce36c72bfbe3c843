"""Start a real Owlet stack for UI tests: Redis (found or embedded), a Celery worker serving the tiny
random-init LFM2-VL checkpoint, and the page, via the same launcher the demo uses.

The tiny model's answers are gibberish, so tests check structure (streaming, stats, errors), not words.
"""
from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

from tests.redis_server import free_port  # tests also import it from here

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


def load_launcher():
    """``scripts/run_demo.py`` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("owlet_run_demo", ROOT / "scripts" / "run_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def read_until_served(proc, timeout_s: float) -> list[str]:
    """The lines a page process printed (stdout, with stderr joined to it) until it said where it serves, it ended,
    or ``timeout_s`` passed."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if line.startswith("Owlet UI: http"):
            break
    return seen


def tiny_model() -> Path:
    from training.tiny_checkpoint import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint("lfm2vl")


def endless_tiny_model() -> Path:
    """The tiny model with its EOS logit pinned at 0: every answer runs to its length limit."""
    from training.tiny_checkpoint import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint("lfm2vl-endless")


def make_image(path: Path, colour=(200, 30, 30), size=(96, 64)) -> Path:
    from PIL import Image

    Image.new("RGB", size, colour).save(path)
    return path


# What every test stack sets: a silent stream is a lost worker after a minute, the queue line refreshes twice a
# second, and a dead worker is noticed within seconds.
TEST_STACK_ENV = {"OWLET_UI_STALL_TIMEOUT_S": "60", "OWLET_UI_QUEUE_POLL_S": "0.5", "OWLET_HEARTBEAT_INTERVAL_S": "0.25",
                  "OWLET_HEARTBEAT_TTL_S": "3"}


@contextlib.contextmanager
def stack_redis(stack) -> Iterator:
    """A Redis client on a running stack's server (for a test's ``r`` fixture)."""
    import redis

    client = redis.Redis.from_url(stack.redis_url)
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def running_stack(label: str, model: Path, env: dict[str, str], worker_concurrency: int) -> Iterator:
    """A started stack (launcher.Stack) in its own key namespace, ready to serve; its keys are deleted after.

    ``env`` adds settings for the worker and the page; ``stack.prefix`` is the namespace. Logs go to
    ``artifacts/<label>-stack-logs``.
    """
    import redis

    from tests.redis_server import running_redis, unique_prefix

    launcher = load_launcher()
    with running_redis() as redis_url:
        prefix = unique_prefix(label)
        stack = launcher.Stack(redis_url, str(model), "127.0.0.1", free_port(), [],
                               worker_concurrency=worker_concurrency, log_dir=ARTIFACTS / f"{label}-stack-logs",
                               extra_env={"OWLET_KEY_PREFIX": prefix, **env})
        with stack:
            stack.wait_ready(timeout_s=180)
            stack.prefix = prefix
            yield stack
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


@contextlib.contextmanager
def launched_page(config, client=None, purge: bool = True, before_launch=None) -> Iterator[tuple[str, object]]:
    """The page for ``config`` built and launched in this process (no worker); yields (url, its OwletClient).
    ``purge``: delete the client's keys afterwards (not possible when its Redis is unreachable).
    ``before_launch(page)``: called with the built Gradio page before it is launched."""
    from ui.ops.launch import launch_page
    from ui.server import build

    page, launch_kwargs, client, _metrics = build(config, client)
    if before_launch is not None:
        before_launch(page)
    # A test never opens a public tunnel; a page configured with share=True still believes the tunnel's hop.
    launch_page(page, {**launch_kwargs, "share": False})
    try:
        yield f"http://127.0.0.1:{config.port}/", client
    finally:
        page.close()
        client.close(purge=purge)
