"""A real page on its own real Redis with no worker, for attacks that need the page alone (or its internals)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import LIMITS
from tests.ui.stack import free_port, launched_page


@contextlib.contextmanager
def page_without_worker(name: str, before_launch: Callable | None = None, **config) -> Iterator[tuple[str, object]]:
    """Every admitted job stays queued and its answer stream stays open, so slots and caps hold still.
    ``before_launch(page)`` may change the built Gradio page first; ``config`` overrides UIConfig fields.
    Yields (url, OwletClient)."""
    from ui.config import UIConfig
    from worker.client import OwletClient
    from worker.config import Settings

    with running_redis() as redis_url:
        prefix = unique_prefix(name)
        client = OwletClient(settings=Settings.from_env(redis_url=redis_url, key_prefix=prefix,
                                                        group_job_cap=LIMITS["group_jobs"]))
        config = UIConfig(**{"port": free_port(), "redis_url": redis_url, "key_prefix": prefix,
                             "trusted_proxies": ("127.0.0.1",), "max_threads": 8, "queue_poll_s": 0.5,
                             "address_refusals": 100_000, **config})
        with launched_page(config, client, before_launch=before_launch) as (url, client):
            yield url, client
