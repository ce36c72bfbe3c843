"""Scheduler: which requests get prompt work this step, and how much.

Policy, in one place:
- admission from the waiting queue while running + prefilling < max_running, fair by group: a free row goes to
  the waiting request whose group holds the fewest rows, then one not started yet before a paused one (within a
  bound), then the earliest (``engine.time_slicing``; with one group and nothing paused, as in benchmarks,
  FIFO). A request that time slicing paused waits in the same queue and, when admitted, rejoins the decode batch
  with its own cache: it needs no prefill;
- at admission a request's cached prefix is restored first (the conversation's session entry, or the shared
  template head), so the budget below is charged only for the tokens that really remain to prefill: a session
  hit with 30 new tokens costs 30, not a whole chunk;
- at most ``max_prefill_tokens`` prompt tokens per step, summed over requests. A longer prompt is prefilled in
  chunks over several steps, and the decode batch runs one step between chunks, so a long prompt (a big image)
  delays running streams by at most one chunk's compute per token;
- a first chunk stops at the end of the template head when that head is not cached yet, so the session store
  can save it for every later conversation;
- a partly prefilled request continues before new ones start, so chunked prompts finish in arrival order.
It imports no model code: the prefix cache is any object with ``restore(request)`` and ``needs_head(head_ids)``
(the engine passes its ``SessionStore``).
"""
from __future__ import annotations

import time
from collections import deque

from .request import Request, Status
from .time_slicing import behind_newcomers, next_in_line, rows_by_group


class Scheduler:
    def __init__(self, max_running: int, max_prefill_tokens: int, prefix_cache=None):
        self.max_running = max_running
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = prefix_cache
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

    def retry(self, request: Request) -> None:
        """Put a request whose prefill or resume was abandoned (out of memory) back at the head of the waiting
        queue; a paused one stays PAUSED (its cache is still parked)."""
        self.remove(request)
        if request.status is not Status.PAUSED:
            request.status = Status.WAITING
        self.waiting.appendleft(request)

    def pending(self) -> list[Request]:
        return list(self.prefilling) + list(self.waiting)

    def schedule(self, running: list[Request]) -> list[tuple[Request, int]]:
        """Return (request, prompt tokens to run now) pairs. Requests are admitted here: a new one moves to
        PREFILLING; a PAUSED one is returned with 0 tokens, still PAUSED, for the engine to resume."""
        budget = self.max_prefill_tokens
        plan: list[tuple[Request, int]] = []
        for req in list(self.prefilling):
            if budget <= 0:
                break
            n = self._chunk(req, budget)
            plan.append((req, n))
            budget -= n
        rows = rows_by_group(list(running) + self.prefilling)
        in_use = len(running) + len(self.prefilling)
        while self.waiting and in_use < self.max_running:
            req = next_in_line(self.waiting, rows)
            if req.status is not Status.PAUSED and budget <= 0:
                break  # the next in line needs prefill budget; later ones wait their turn behind it
            if not req.output_ids:  # count it against the paused answers it went ahead of (OVERTAKE_LIMIT)
                for other in self.waiting:
                    if other is req:
                        break
                    if rows[other.group] == rows[req.group] and behind_newcomers(other):
                        other.overtaken += 1
            self.waiting.remove(req)
            rows[req.group] += 1
            in_use += 1
            if req.status is Status.PAUSED:
                plan.append((req, 0))
                continue
            self._admit(req)
            n = self._chunk(req, budget)
            plan.append((req, n))
            budget -= n
        return plan

    def prefill_done(self, request: Request) -> None:
        self.prefilling.remove(request)

    def _admit(self, req: Request) -> None:
        req.status = Status.PREFILLING
        req.prefill_start = time.monotonic()
        self.prefilling.append(req)
        if self.prefix_cache is not None:
            self.prefix_cache.restore(req)  # sets req.num_computed to the reused prefix; never raises

    def _chunk(self, req: Request, budget: int) -> int:
        n = min(req.remaining_prefill, budget)
        head = len(req.prompt.head_ids or ())
        if (req.num_computed == 0 and head and self.prefix_cache is not None
                and self.prefix_cache.needs_head(req.prompt.head_ids)):
            n = min(n, head)
        return n
