"""The demo's embedded Redis keeps its data in the folder the README names, so a demo restart keeps
conversations (only the Redis part of the launcher runs here; tests/ui/test_demo_launcher.py runs it all)."""
from __future__ import annotations

import redis

from owlet import demo
from tests.deploy.services import ROOT
from tests.ui.stack import free_port


def start_embedded(data_dir) -> tuple[demo.Stack, str]:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # no Redis answers there, so the launcher embeds one
    stack = demo.Stack(nobody, "unused-model", "127.0.0.1", free_port(), [], 1, redis_dir=data_dir)
    return stack, stack._redis()


def test_a_demo_restart_keeps_what_its_embedded_redis_held(tmp_path):
    data_dir = tmp_path / "demo-redis"
    stack, url = start_embedded(data_dir)
    try:
        r = redis.Redis.from_url(url)
        r.rpush("owlet:conv:c1:turns", "first turn", "its answer")
        r.close()
    finally:
        stack.stop()
    assert data_dir.is_dir() and any(data_dir.rglob("*.aof")), "an append-only file in the named folder"

    stack, url = start_embedded(data_dir)
    try:
        r = redis.Redis.from_url(url)
        assert r.lrange("owlet:conv:c1:turns", 0, -1) == [b"first turn", b"its answer"]
        r.close()
    finally:
        stack.stop()
    assert data_dir.is_dir(), "a named data folder is kept when the demo stops"


def test_the_readme_names_the_demo_data_folder():
    assert demo.DEFAULT_REDIS_DIR == ROOT / ".cache" / "demo-redis"
    assert "`.cache/demo-redis/`" in (ROOT / "README.md").read_text()
    assert demo.parse_args([]).redis_dir == demo.DEFAULT_REDIS_DIR
