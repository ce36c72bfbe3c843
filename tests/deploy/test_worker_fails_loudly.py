"""A worker that cannot load its engine exits non-zero within seconds and says why on stderr.

Each case runs the real ``owlet-worker`` console script (the README's command) from a folder that is not the
checkout, against a real Redis, and checks that it neither hangs nor claims to be ready.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.redis_server import redis_url_fixture, unique_prefix
from worker.serving.startup import EXIT_CANNOT_SERVE

redis_url = redis_url_fixture()
BIN = Path(sys.executable).parent
LIMIT_S = 30  # the settings and folder checks import nothing heavy: ~3 s here, even on a loaded machine
# Failures found while importing or loading (torch, transformers, the weights) cannot be faster than that
# import: 8 s of CPU, and up to 45 s of wall time on this shared 2-core machine under load.
HEAVY_LIMIT_S = 120


def run_worker(env_overrides: dict[str, str | None], redis_url: str, cwd: Path,
               limit_s: float = LIMIT_S, argv=("owlet-worker", "-n", "loud@%h")) -> tuple[int, str, float, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OWLET_")}
    env.update(REDIS_URL=redis_url, OWLET_KEY_PREFIX=unique_prefix("loud"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    started = time.monotonic()
    result = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=limit_s + 30)
    return result.returncode, result.stderr + result.stdout, time.monotonic() - started, limit_s


def assert_fails_loudly(code: int, output: str, elapsed: float, limit_s: float, *phrases: str) -> None:
    assert code == EXIT_CANNOT_SERVE, f"exit {code}, output:\n{output[-3000:]}"
    assert elapsed < limit_s, f"took {elapsed:.1f} s"
    assert "cannot start" in output and " ready." not in output, output[-3000:]
    for phrase in phrases:
        assert phrase in output, f"{phrase!r} not in:\n{output[-3000:]}"


def test_unset_model(redis_url, tmp_path):
    assert_fails_loudly(*run_worker({"OWLET_MODEL": None}, redis_url, tmp_path), "OWLET_MODEL is not set")


def test_celerys_own_command_fails_loudly_too(redis_url, tmp_path):
    """`celery -A worker.main worker` (compose's Flower uses that app too) takes the same start-up path."""
    argv = ("celery", "-A", "worker.main", "worker", "-P", "threads", "-n", "loud@%h", "--without-gossip")
    assert_fails_loudly(*run_worker({"OWLET_MODEL": None}, redis_url, tmp_path, argv=argv), "OWLET_MODEL is not set")


def test_model_folder_that_does_not_exist(redis_url, tmp_path):
    missing = tmp_path / "no-such-model"
    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(missing)}, redis_url, tmp_path),
                        str(missing), "no such folder")


def test_folder_that_is_not_a_checkpoint(redis_url, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(tmp_path / "empty")}, redis_url, tmp_path),
                        "no config.json")


def test_unsupported_architecture(redis_url, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    # The verified-families registry reads config.json only, so this is as quick as the folder checks.
    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(folder)}, redis_url, tmp_path),
                        "'BertModel' is not a model family Owlet has verified", "OWLET_ALLOW_UNVERIFIED")


def test_checkpoint_whose_weights_do_not_load(redis_url, tmp_path):
    """A config that passes the checks but a load that fails: the engine's own exception is the reason."""
    from tests.ui.stack import tiny_model

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model() / "config.json").read_text())  # no weights, no processor
    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(folder), "OWLET_DEVICE": "cpu"}, redis_url, tmp_path,
                                    HEAVY_LIMIT_S), "engine start-up failed")


def test_checkpoint_without_a_chat_template(redis_url, tmp_path):
    """Loads, but no question could be put to it: refused at load, not on every question once ready."""
    import shutil

    from tests.ui.stack import tiny_model

    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model(), folder)
    (folder / "chat_template.jinja").unlink()
    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(folder), "OWLET_DEVICE": "cpu"}, redis_url, tmp_path,
                                    HEAVY_LIMIT_S), "has no chat template", "copy every file of the model repository")


def test_a_metrics_port_another_process_holds_is_named_before_the_model_loads(redis_url, tmp_path):
    """Two workers on one host with one OWLET_WORKER_METRICS_PORT: the second said "OSError: [Errno 98] Address
    already in use" after loading its model (minutes on a GPU), naming neither the setting nor the port."""
    import socket

    from tests.ui.stack import tiny_model

    with socket.socket() as first:
        first.bind(("127.0.0.1", 0))
        first.listen()
        port = first.getsockname()[1]
        code, output, elapsed, limit_s = run_worker({"OWLET_MODEL": str(tiny_model()), "OWLET_DEVICE": "cpu",
                                                     "OWLET_WORKER_METRICS_PORT": str(port)}, redis_url, tmp_path)
    assert_fails_loudly(code, output, elapsed, limit_s, f"OWLET_WORKER_METRICS_PORT={port}",
                        "a port of its own, or 0 for none")
    assert "loaded" not in output, "refused before the model loads"


def test_import_error_in_the_engine_factory(redis_url, tmp_path):
    assert_fails_loudly(*run_worker({"OWLET_ENGINE_FACTORY": "no_such_module_xyz:make"}, redis_url, tmp_path,
                                    HEAVY_LIMIT_S), "ModuleNotFoundError", "no_such_module_xyz")


def test_cuda_requested_but_absent(redis_url, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from tests.ui.stack import tiny_model

    assert_fails_loudly(*run_worker({"OWLET_MODEL": str(tiny_model()), "OWLET_DEVICE": "cuda"}, redis_url, tmp_path,
                                    HEAVY_LIMIT_S), "OWLET_DEVICE='cuda' but CUDA is not available")


def test_bad_setting_is_refused_before_celery_starts(redis_url, tmp_path):
    code, output, elapsed, _limit = run_worker({"OWLET_USER_QUEUE_CAP": "plenty"}, redis_url, tmp_path)
    assert code == 2 and elapsed < LIMIT_S, output[-2000:]
    assert "OWLET_USER_QUEUE_CAP='plenty' is not an integer" in output


def test_a_worker_of_another_checkpoint_does_not_join_a_served_queue(redis_url, tmp_path):
    """The line hands a question to whichever worker takes it: a second checkpoint on one queue would answer some
    questions, silently, under the model name the client asked for. The worker says so and exits instead."""
    import threading

    import redis as redis_lib

    from tests.ui.stack import tiny_model
    from worker import heartbeat
    from worker.store.keys import Keys

    prefix = unique_prefix("two-models")
    r, keys, stop = redis_lib.Redis.from_url(redis_url), Keys(prefix), threading.Event()

    def serving_another():  # a live worker of another checkpoint on the same queue
        while not stop.is_set():
            heartbeat.publish(r, keys, heartbeat.Heartbeat(worker="gpu0@elsewhere", capacity=8, model="llava-1.5-7b"),
                              ttl_s=4.0)
            stop.wait(0.5)
    beating = threading.Thread(target=serving_another, daemon=True)
    beating.start()
    try:
        code, output, elapsed, limit_s = run_worker({"OWLET_MODEL": str(tiny_model()), "OWLET_DEVICE": "cpu",
                                                     "OWLET_KEY_PREFIX": prefix}, redis_url, tmp_path, HEAVY_LIMIT_S)
    finally:
        stop.set()
        beating.join()
    assert_fails_loudly(code, output, elapsed, limit_s, "serve 'llava-1.5-7b', and this one serves "
                        f"'{tiny_model().name}'", "One queue serves one checkpoint", "OWLET_KEY_PREFIX")
    assert set(heartbeat.alive(r, keys)) <= {"gpu0@elsewhere"}, "it never announced itself"
    r.delete(keys.heartbeat("gpu0@elsewhere"), keys.workers)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_a_redis_that_evicts_keys_when_full_is_refused(tmp_path, policy):
    """Jobs, streams and conversations carry expiries, so any policy but noeviction would drop questions in line,
    answers and conversations once Redis is full, without a word (a managed Redis often ships one). With noeviction
    a full Redis refuses a new turn whole and the visitor is told; the worker insists on it."""
    import redis as redis_lib

    from tests.redis_server import OwnedRedis
    from tests.ui.stack import tiny_model

    server = OwnedRedis(tmp_path / "redis")  # (a TCP one: Celery's broker takes no unix socket URL)
    try:
        r = redis_lib.Redis.from_url(server.url)
        r.config_set("maxmemory", str(64 * 2**20))
        r.config_set("maxmemory-policy", policy)
        assert_fails_loudly(*run_worker({"OWLET_MODEL": str(tiny_model()), "OWLET_DEVICE": "cpu"}, server.url,
                                        tmp_path, HEAVY_LIMIT_S),
                            f"its maxmemory-policy is {policy}", "67,108,864 bytes", "Set maxmemory-policy noeviction")
    finally:
        server.stop()


@pytest.mark.parametrize("lacks", ["the FUNCTION command", "the scripting permission"])
def test_a_redis_that_cannot_run_the_queues_functions_is_named_with_what_to_change(tmp_path, lacks):
    """The queue is a library of Redis functions: a Redis older than 7.0 has no FUNCTION command (here it is renamed
    away, as an operator may), and an ACL user may lack the scripting commands. Either is said in a sentence naming
    the change, not as Redis's own "unknown command" error with the library's first line."""
    import redis as redis_lib

    from tests.redis_server import OwnedRedis
    from tests.ui.stack import tiny_model

    renamed = ("--rename-command", "FUNCTION", "") if lacks == "the FUNCTION command" else ()
    server = OwnedRedis(tmp_path / "redis", extra=renamed)
    try:
        url = server.url
        if lacks == "the scripting permission":
            redis_lib.Redis.from_url(url).acl_setuser("owlet", enabled=True, passwords=["+secret"], keys=["*"],
                                                      channels=["*"], commands=["+@all", "-@scripting"])
            url = f"redis://owlet:secret@127.0.0.1:{server.port}/0"
        said = ("has no FUNCTION command", "disabled or renamed", "enable FUNCTION and FCALL") if renamed else \
            ("may not load functions", "+@scripting")
        assert_fails_loudly(*run_worker({"OWLET_MODEL": str(tiny_model()), "OWLET_DEVICE": "cpu"}, url, tmp_path,
                                        HEAVY_LIMIT_S), *said)
    finally:
        server.stop()
