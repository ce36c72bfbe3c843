"""``--quick``: every benchmark's seconds-long run on a tiny workload, through the same code as the full run.

A quick run still prints the benchmark's table and its ``RESULT {json}`` line, so ``tests/bench`` can run each one
and check its figures: a benchmark that no longer runs fails a test instead of waiting for the next person who
needs its numbers. Its figures say nothing about speed.
"""
from __future__ import annotations

import argparse

QUICK_HELP = "a tiny workload in seconds, through the same code: checks the benchmark runs, measures nothing"


def add_quick_flag(parser: argparse.ArgumentParser, *aliases: str) -> None:
    """Add ``--quick`` (and any older spelling in ``aliases``, e.g. ``--tiny``) as ``args.quick``."""
    parser.add_argument("--quick", *aliases, dest="quick", action="store_true", help=QUICK_HELP)


def parse_with_quick(parser: argparse.ArgumentParser, argv, quick_defaults: dict):
    """Parse ``argv``; under ``--quick`` the arguments named in ``quick_defaults`` default to its values instead.

    Arguments given on the command line win either way, and ``--help`` still shows the full run's defaults."""
    first, _ = parser.parse_known_args(argv)
    if first.quick:
        parser.set_defaults(**quick_defaults)
    return parser.parse_args(argv)
