"""The demo's Redis: its own embedded one by default, which keeps its data in the folder the README names (so a
demo restart keeps conversations), and an existing server only when asked for one (only the Redis part of the
launcher runs here; tests/ui/test_demo_launcher.py runs it all)."""
from __future__ import annotations

import pytest
import redis

from owlet import demo
from tests.deploy.services import ROOT
from tests.redis_server import redis_on_the_default_url
from tests.ui.stack import free_port


def start_embedded(data_dir) -> tuple[demo.Stack, str]:
    stack = demo.Stack(None, "unused-model", "127.0.0.1", free_port(), [], 1, redis_dir=data_dir)
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


def test_the_readme_names_the_demo_data_folders(monkeypatch):
    monkeypatch.delenv("GRADIO_TEMP_DIR", raising=False)
    readme = (ROOT / "README.md").read_text()
    assert demo.DEFAULT_REDIS_DIR == ROOT / ".cache" / "demo-redis" and "`.cache/demo-redis/`" in readme
    assert demo.DEFAULT_UPLOADS_DIR == ROOT / ".cache" / "demo-uploads" and "`.cache/demo-uploads/`" in readme
    args = demo.parse_args([])
    assert (args.redis_dir, args.uploads_dir) == (demo.DEFAULT_REDIS_DIR, demo.DEFAULT_UPLOADS_DIR)


def test_the_demo_runs_its_own_redis_unless_told_to_use_another(monkeypatch, tmp_path):
    """A Redis answering at the default URL (other jobs' on this machine) is not the demo's: only --redis-url or
    REDIS_URL name one, and one that does not answer stops the demo with the reason, not a silent embedded one."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert demo.parse_args([]).redis_url is None, "no Redis named: the demo's own"
    with redis_on_the_default_url(tmp_path / "default-redis") as default_url:
        stack = demo.Stack(None, "unused-model", "127.0.0.1", free_port(), [], 1)
        try:
            own = stack._redis()
            assert own != default_url and stack.embedded is not None
        finally:
            stack.stop()
        monkeypatch.setenv("REDIS_URL", default_url)
        assert demo.parse_args([]).redis_url == default_url
        assert demo.parse_args(["--redis-url", "redis://elsewhere:6379/1"]).redis_url == "redis://elsewhere:6379/1"
        told = demo.Stack(default_url, "unused-model", "127.0.0.1", free_port(), [], 1)
        assert told._redis() == default_url and told.embedded is None, "asked for: used, nothing embedded"
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(RuntimeError, match=f"no Redis answers at {nobody}"):
        demo.Stack(nobody, "unused-model", "127.0.0.1", free_port(), [], 1)._redis()
