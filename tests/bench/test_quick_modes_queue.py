"""The ``--quick`` modes of the queue's benchmarks: floods, crowds, fairness, the queue's own cost.

What each run must show, and why the benchmarks are split by kind: tests/bench/quick_modes.py.
"""
from __future__ import annotations

import pytest

from tests.bench.quick_modes import check_quick_mode, kind
from tests.bench.quick_modes import quick_runs  # noqa: F401 (the fixture)


@pytest.mark.parametrize("name", kind("queue"))
def test_quick_mode(name, quick_runs):
    check_quick_mode(name, quick_runs)
