"""Fixtures for UI tests: one real stack (Redis, worker with a tiny model, page) shared by the session."""
from __future__ import annotations

import pytest
import redis

from tests.redis_server import running_redis, unique_prefix
from tests.ui.page_client import METRICS_TOKEN, STACK_MAX_NEW_TOKENS
from tests.ui.stack import ARTIFACTS, free_port, load_launcher, tiny_model


@pytest.fixture(scope="session")
def stack():
    launcher = load_launcher()
    with running_redis() as redis_url:
        prefix = unique_prefix("ui")
        env = {"OWLET_KEY_PREFIX": prefix, "OWLET_UI_MAX_NEW_TOKENS": str(STACK_MAX_NEW_TOKENS),
               "OWLET_UI_MAX_NEW_TOKENS_CAP": "1500",
               "OWLET_UI_STALL_TIMEOUT_S": "60", "OWLET_UI_QUEUE_POLL_S": "0.5", "OWLET_HEARTBEAT_INTERVAL_S": "0.25",
               "OWLET_HEARTBEAT_TTL_S": "3", "OWLET_MAX_RUNNING": "16",
               "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN, "OWLET_UI_ADDRESS_MAX_EVENTS": "16",
               "OWLET_GROUP_JOB_CAP": "16", "OWLET_GROUP_SUBMIT_LIMIT": "500"}
        s = launcher.Stack(redis_url, str(tiny_model()), "127.0.0.1", free_port(), [], worker_concurrency=18,
                           log_dir=ARTIFACTS / "ui-stack-logs", extra_env=env)
        with s:
            s.wait_ready(timeout_s=180)
            s.prefix = prefix
            yield s
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()
