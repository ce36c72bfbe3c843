"""Suite-wide settings."""
from __future__ import annotations

import os


def pytest_configure(config):
    """Under pytest-xdist, each of N processes computes on its share of the cores (torch's intra-op threads): with
    torch's default of every core in each process, N processes on a small machine oversubscribe it and its OpenMP
    threads wait on each other. Tests that need a number of threads set it themselves. The processes a test starts
    (workers, pages, benchmarks) get the same share through OMP_NUM_THREADS, unless the caller set it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
