"""The ``--quick`` modes of the engine's benchmarks, in-process: throughput, prefill, sessions, peers.

What each run must show, and why the benchmarks are split by kind: tests/bench/quick_modes.py.
"""
from __future__ import annotations

import pytest

from tests.bench.quick_modes import BENCHMARKS, KINDS, check_quick_mode, kind
from tests.bench.quick_modes import quick_runs  # noqa: F401 (the fixture)


@pytest.mark.parametrize("name", kind("engine"))
def test_quick_mode(name, quick_runs):
    check_quick_mode(name, quick_runs)


def test_every_benchmark_has_one_kind():
    """Each benchmark is run by exactly one of the test_quick_modes_*.py files."""
    kinds = [bench for names in KINDS.values() for bench in names]
    assert sorted(kinds) == sorted(BENCHMARKS), f"kinds {sorted(kinds)} against benchmarks {sorted(BENCHMARKS)}"
