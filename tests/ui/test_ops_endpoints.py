"""/healthz and /metrics on the real page and a real Redis, before any worker exists, and with Redis gone."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig

pytestmark = pytest.mark.timeout(120)


TOKEN = "ops-test-token"


def get(url: str, token: str | None = TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def page_without_workers():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("uiops"),
                          metrics_token=TOKEN)
        with launched_page(config) as (url, client):
            yield url, client


def test_healthz_is_503_without_a_worker_and_metrics_still_render(page_without_workers):
    url, _client = page_without_workers
    status, body = get(url + "healthz")
    health = json.loads(body)
    assert status == 503 and health["redis"] is True and health["workers"] == []
    assert health["reason"] == "no worker heartbeat is alive"
    status, text = get(url + "metrics")
    assert status == 200
    assert "owlet_redis_up 1.0" in text and "owlet_workers_alive 0.0" in text
    assert "# TYPE owlet_time_to_first_token_seconds histogram" in text


def test_a_worker_heartbeat_makes_healthz_ok(page_without_workers):
    from worker.heartbeat import Heartbeat, publish

    url, client = page_without_workers
    publish(client.r, client.keys, Heartbeat(worker="w1@test", capacity=4, running=3), ttl_s=30)
    status, body = get(url + "healthz")
    assert status == 200 and json.loads(body)["workers"] == ["w1@test"]
    assert get(url + "healthz", token=None) == (200, '{"ok":true}'), "no worker names without the token"
    _, text = get(url + "metrics")
    assert "owlet_batch_occupancy 0.75" in text and "w1@test" not in text


def test_metrics_need_the_bearer_token(page_without_workers):
    url, _client = page_without_workers
    assert get(url + "metrics", token=None)[0] == 401
    assert get(url + "metrics", token="wrong")[0] == 401


def test_redis_down_gives_503_and_redis_up_zero():
    config = UIConfig(port=free_port(), redis_url=f"redis://127.0.0.1:{free_port()}/0", metrics_token=TOKEN)
    with launched_page(config, purge=False) as (url, _client):
        status, body = get(url + "healthz")
        assert status == 503 and json.loads(body)["reason"] == "Redis is not reachable"
        status, text = get(url + "metrics")
        assert status == 200 and "owlet_redis_up 0.0" in text


def test_gradios_monitoring_is_off_and_its_per_event_summary_never_built():
    """Gradio's /monitoring endpoints would show any visitor the traffic per endpoint, and its queue rebuilt a
    pandas summary of up to 10,000 event records at the end of every event (ui.gradio_adapters.event_costs)."""
    from gradio_client import Client

    from ui.ops.launch import launch_page
    from ui.server import build

    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("uimon"),
                          metrics_token=TOKEN)
        page, launch_kwargs, client, _metrics = build(config)
        launch_page(page, launch_kwargs)
        try:
            url = f"http://127.0.0.1:{config.port}/"
            visitor = Client(url, verbose=False)
            token = visitor.predict(None, api_name="/identity")
            for _ in range(3):  # queued events that end at once: an empty message is refused with a sentence
                _box, _chat, status = visitor.predict({"text": "", "files": []}, 16, token, api_name="/chat")
                assert status.startswith("Type a question"), status
            visitor.close()
            assert page._queue.events_recorded >= 3, "the events went through Gradio's queue"
            assert page._queue.cached_event_analytics_summary == {"functions": {}}, "summary never rebuilt"
            assert len(page._queue.event_analytics) <= 1
            for path in ("monitoring", "monitoring/summary", "gradio_api/monitoring", "gradio_api/monitoring/summary"):
                status_code, _body = get(url + path, token=None)
                assert status_code in (403, 404), (path, status_code)
        finally:
            page.close()
            client.close(purge=True)
