"""Scheduler: which requests get prompt work this step, and how much.

Policy, in one place:
- FIFO admission from the waiting queue while running + prefilling < max_running;
- at most ``max_prefill_tokens`` prompt tokens per step, summed over requests. A longer prompt is prefilled in
  chunks over several steps, and the decode batch runs one step between chunks, so a long prompt (a big image)
  delays running streams by at most one chunk's compute per token;
- a partly prefilled request continues before new ones start, so chunked prompts finish in arrival order.
It imports no model code.
"""
from __future__ import annotations

from collections import deque

from .request import Request, Status


class Scheduler:
    def __init__(self, max_running: int, max_prefill_tokens: int):
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, request: Request) -> bool:
        for queue in (self.waiting, self.prefilling):
            if request in queue:
                queue.remove(request)
                return True
        return False

    def pending(self) -> list[Request]:
        return list(self.prefilling) + list(self.waiting)

    def schedule(self, num_running: int) -> list[tuple[Request, int]]:
        """Return (request, prompt tokens to run now) pairs. Requests are moved to PREFILLING here."""
        budget = self.max_prefill_tokens
        plan: list[tuple[Request, int]] = []
        for req in list(self.prefilling):
            if budget <= 0:
                break
            n = min(req.remaining_prefill, budget)
            plan.append((req, n))
            budget -= n
        while self.waiting and budget > 0 and num_running + len(self.prefilling) < self.max_running:
            req = self.waiting.popleft()
            req.status = Status.PREFILLING
            self.prefilling.append(req)
            n = min(req.remaining_prefill, budget)
            plan.append((req, n))
            budget -= n
        return plan

    def prefill_done(self, request: Request) -> None:
        self.prefilling.remove(request)
