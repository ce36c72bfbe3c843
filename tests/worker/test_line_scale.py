"""Every queue operation costs the same number of Redis commands with 10,000 visitors waiting as with 100, and none
of them scans a list that grows with the crowd.

A crowd is the normal case: a shared link brings thousands, each its own client group. Counted on a Redis of this
test's own (``INFO commandstats``, calls inside scripts included), so the counts are exact and nothing else moves
them; the time they take is bench/queue_scale.py's to measure. A command's count does not show what one command
scans: a list's removal (LREM) or search walks it in Redis's C, so the lists the queue keeps must stay as short as
the caps make them, whatever the number waiting.
"""
from __future__ import annotations

import pytest

from tests.redis_server import small_redis, unique_prefix
from tests.worker.queue_state import fill_line
from worker.client import OwletClient
from worker.config import Settings

SIZES = (100, 10_000)


def commands(r) -> int:
    return sum(int(v["calls"]) for k, v in r.info("commandstats").items() if k.startswith("cmdstat_"))


def longest_list(r, prefix: str) -> int:
    """The length of the longest list under ``prefix``."""
    return max((r.llen(key) for key in r.scan_iter(match=prefix + "*", count=1000, _type="list")), default=0)


def counted(r, call) -> int:
    """Commands Redis ran for ``call()``, less the reading's own."""
    r.config_resetstat()
    call()
    return commands(r) - 1  # the CONFIG RESETSTAT itself


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory):
    with small_redis(tmp_path_factory.mktemp("line-scale")) as url:
        yield url


def operation_costs(url: str, waiting: int, fifo: bool = False) -> dict[str, int]:
    settings = Settings.from_env(redis_url=url, key_prefix=unique_prefix("scale"), global_queue_cap=2 * waiting + 100,
                                 fifo=fifo)
    client = OwletClient(settings=settings)
    try:
        jobs = fill_line(client, waiting)
        assert longest_list(client.r, settings.key_prefix) <= 1, "a list holding every waiting visitor's question"
        middle = jobs[waiting // 2]
        assert client.queue_position(middle) == waiting // 2 + 1
        costs = {"position": counted(client.r, lambda: client.queue_position(middle))}
        some = jobs[:: max(1, waiting // 100)][:100]
        costs["100 places at once"] = counted(client.r, lambda: client.queue_positions(some))
        costs["submit"] = counted(client.r, lambda: client.submit("newcomer", None, "Hello?", group="new-address"))
        popped = []
        costs["pop"] = counted(client.r, lambda: popped.append(client.jobs.pop(10 ** 6)[0]))
        # its worker lost: put back at the front, then served again
        costs["requeue"] = counted(client.r, lambda: client.jobs.requeue(popped[0], "worker lost"))
        assert client.queue_position(popped[0]) == 1, "a job put back goes first"
        costs["pop again"] = counted(client.r, lambda: popped.append(client.jobs.pop(10 ** 6)[0]))
        assert popped[1] == popped[0]
        costs["finish"] = counted(client.r, lambda: client.jobs.finish(popped[0], "done"))
        costs["cancel"] = counted(client.r, lambda: client.jobs.cancel(jobs[-1]))
        assert popped[0] == jobs[0] and client.queue_position(middle) == waiting // 2, "served in order"
        return costs
    finally:
        client.close(purge=True)


@pytest.mark.parametrize("fifo", [False, True], ids=["fair line", "fifo"])
def test_every_queue_operation_costs_the_same_commands_at_10000_waiting_as_at_100(own_redis, fifo):
    """In FIFO mode (``OWLET_FIFO``, the benchmarks' baseline) every visitor waits in one shared group: its jobs must
    not be rewritten when one of them is served, cancelled or put back."""
    operation_costs(own_redis, 10, fifo)  # Redis loads each script at its first call: counted once, before these
    small, large = (operation_costs(own_redis, n, fifo) for n in SIZES)
    assert large == small, f"commands per operation, {SIZES[0]} waiting: {small}; {SIZES[1]}: {large}"
    assert small["position"] <= 12 and small["100 places at once"] <= 12 * 100, small
