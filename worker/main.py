"""The worker's entry points.

- ``owlet-worker [celery worker options]`` (also ``python -m worker``): a Celery worker with Owlet's defaults
  (threads pool, no gossip, mingle or Celery heartbeat: Owlet has its own), serving one engine loaded at
  start-up. It exits non-zero, with the reason on stderr, when the settings are bad or the engine cannot start.
  Options you pass go after the defaults, so they win (e.g. ``-n gpu0@%h``, ``-c 18``, ``--loglevel WARNING``).
- ``celery -A worker.main worker ...`` and ``celery -A worker.main flower``: the same app for Celery's own CLI.

Importing this module reads nothing and connects to nothing: ``app`` is built on first access.
"""
from __future__ import annotations

import functools
import sys

DEFAULT_WORKER_ARGS = ("-P", "threads", "--without-gossip", "--without-mingle", "--without-heartbeat",
                       "--loglevel", "INFO")


@functools.cache
def _app():
    from worker.celery_app import create_app

    return create_app(with_runtime=True)


def __getattr__(name: str):
    if name == "app":  # what `celery -A worker.main` looks up
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(argv: list[str] | None = None) -> int:
    """``owlet-worker``: start a worker; returns (or exits with) a non-zero code when it cannot serve."""
    from owlet.settings import SettingError
    from worker.serving import startup

    startup.configure_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        app = _app()
    except (SettingError, ValueError, AssertionError) as exc:
        print(f"owlet-worker: bad setting: {exc}", file=sys.stderr, flush=True)
        return 2
    app.worker_main(["worker", *DEFAULT_WORKER_ARGS, *argv])
    return 0


if __name__ == "__main__":
    sys.exit(run())
