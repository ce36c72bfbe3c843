"""A clock tests move by hand, for ledgers that take a ``clock`` callable (monotonic seconds)."""
from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now
