"""OWLET_MODEL naming a Hugging Face repository whose files are in this machine's Hugging Face cache, as `hf download`
and `from_pretrained` leave them (blobs, and a snapshot folder of links to them per revision): the engine's command
answers from it and a worker serves it under the repository's name; a repository id that is not cached is refused
with the command that fetches it. The cache is built here from the tiny checkpoint, in the cache's own layout."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from engine.config import EngineConfig
from engine.models import checkpoint_folder
from engine.models.checkpoint_folder import served_name
from tests.deploy.test_worker_fails_loudly import BIN, assert_fails_loudly, run_worker
from tests.redis_server import redis_url_fixture, unique_prefix
from tests.ui.stack import make_image, tiny_model

redis_url = redis_url_fixture()
REPO = "owlet-tests/tiny-lfm2vl"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo: str = REPO, source: Path | None = None) -> Path:
    """A Hugging Face cache under ``root`` holding ``repo`` (the tiny checkpoint's files) at REVISION, with refs/main
    naming it; returns the snapshot folder."""
    source = source or tiny_model()
    repo_folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_folder / "snapshots" / REVISION
    (repo_folder / "blobs").mkdir(parents=True)
    for file in source.rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            blob = repo_folder / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snapshot / file.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_folder / "refs").mkdir()
    (repo_folder / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The cache, named for this process (huggingface_hub reads HF_HUB_CACHE once, at import) and for the
    processes a test starts."""
    import huggingface_hub.constants

    root = tmp_path / "hub"
    snapshot = hub_cache(root)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    return root, snapshot


def test_a_cached_repository_resolves_to_its_snapshot_and_is_served_under_its_name(cache, tmp_path, monkeypatch):
    root, snapshot = cache
    assert checkpoint_folder.checkpoint_folder(REPO) == snapshot
    assert EngineConfig(model=REPO).model == str(snapshot)
    assert served_name(str(snapshot)) == "tiny-lfm2vl" and served_name("/models/LFM2-VL-1.6B") == "LFM2-VL-1.6B"
    # The repository's folder in the cache, named instead of its snapshot: the snapshot refs/main names.
    repo_folder = str(root / "models--owlet-tests--tiny-lfm2vl")
    assert checkpoint_folder.checkpoint_folder(repo_folder) == snapshot
    assert EngineConfig(model=repo_folder).model == str(snapshot)
    # A folder of that relative name, where one exists, is the folder meant.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owlet-tests" / "tiny-lfm2vl").mkdir(parents=True)
    assert checkpoint_folder.checkpoint_folder(REPO) == Path(REPO)
    # Neither a folder nor in the cache: None, and the advice names the command that fetches it.
    assert checkpoint_folder.cached_repo_folder("owlet-tests/not-cached") is None
    advice = checkpoint_folder.not_found_advice("owlet-tests/not-cached")
    assert "hf download owlet-tests/not-cached" in advice and str(root) in advice
    assert checkpoint_folder.not_found_advice("/models/missing") == ""


def test_the_engines_command_answers_from_a_cached_repository(cache, tmp_path):
    root, _snapshot = cache
    env = {**os.environ, "HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1", "OWLET_DEVICE": "cpu"}
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, "-m", "engine", "--model", REPO, "--image",
                          str(make_image(tmp_path / "red.png")), "--max-new-tokens", "4", "What colour?"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "prompt tokens" in run.stderr, run.stderr[-2000:]


def test_a_repository_id_not_in_the_cache_is_refused_with_how_to_fetch_it(redis_url, tmp_path):
    code, output, elapsed, limit_s = run_worker({"OWLET_MODEL": "owlet-tests/not-cached",
                                                 "HF_HUB_CACHE": str(tmp_path / "empty-hub")}, redis_url, tmp_path)
    assert_fails_loudly(code, output, elapsed, limit_s, "no such folder", "hf download owlet-tests/not-cached",
                        str(tmp_path / "empty-hub"))
    run = subprocess.run([sys.executable, "-m", "engine", "--model", "owlet-tests/not-cached", "Hello?"], cwd=tmp_path,
                         env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-hub")}, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "no such folder" in run.stderr and "hf download" in run.stderr, run.stderr[-2000:]
    assert "architectures" not in run.stderr, "a missing folder is not an unknown model family"


def test_a_worker_serves_a_cached_repository_under_its_name(cache, redis_url, tmp_path):
    from worker import heartbeat
    from worker.store.keys import Keys

    root, _snapshot = cache
    prefix = unique_prefix("cached-repo")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OWLET_")}
    env.update(REDIS_URL=redis_url, OWLET_KEY_PREFIX=prefix, OWLET_MODEL=REPO, OWLET_DEVICE="cpu",
               HF_HUB_CACHE=str(root), HF_HUB_OFFLINE="1", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    worker = subprocess.Popen(["owlet-worker", "-n", "cached@%h"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    r, keys = redis.Redis.from_url(redis_url), Keys(prefix)
    try:
        deadline, models = time.monotonic() + 180, []
        while time.monotonic() < deadline and not models:
            assert worker.poll() is None, worker.stdout.read()[-3000:]
            models = heartbeat.served_models(heartbeat.alive(r, keys))
            time.sleep(0.5)
        assert models == ["tiny-lfm2vl"], models
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        for key in r.scan_iter(match=prefix + "*", count=1000):
            r.delete(key)
        r.close()
