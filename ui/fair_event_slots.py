"""Gradio's event slots shared fairly between client addresses.

Gradio runs at most ``max_threads`` events at once (its queue's slots) and gives each free slot to the oldest
waiting event. An answer stream holds its slot until the answer ends, so sixteen addresses, each at its limit of
four events (``address_max_events``), held all 64 slots, and a new visitor's question waited behind the events
they kept resubmitting: 51 s to a first token that the worker produced in 0.05 s (a hostile audit, 2026-12-03,
answers of 1,024 tokens). And waiting events had no per-address limit at all, so one address could fill Gradio's
whole waiting queue (``queue_max_size``), after which every join was refused "Queue is full".

So:

- a free slot goes to the waiting event of the address running the fewest events: a visitor running nothing waits
  for the next slot to come free, not behind everyone else's backlog;
- among addresses running equally many, an address's recent use of the slots counts against it, as the worker's
  queue counts a client group's time in flight (worker/lua.py, the same half-life, weight and cap): an event lines
  up as if it had arrived ``min(GROUP_USAGE_WEIGHT x usage, GROUP_USAGE_CAP_S)`` later, ``usage`` being the seconds
  its address's answers streamed (first token to end, charged by ui/handlers.py), halved every
  ``GROUP_USAGE_HALF_LIFE_S``. Not the seconds its events held slots: a visitor whose first answer waited a minute
  in the workers' queue while holding its slot was then set back for its follow-up (a hostile audit at 100
  addresses: follow-ups' median time to a slot 88 s against 64 without the usage). Without it a crowd address whose
  answer had just ended (so running nothing) and which re-asked at once went before a visitor who arrived a moment
  later (a hostile audit with 100 addresses, 2026-12-03: most of a visitor's wait was here). The cap keeps a heavy
  user's wait bounded;
- an address may have at most ``max_waiting`` events waiting; one more is refused at once with a sentence
  (HTTP 503, as Gradio refuses a full queue), so filling the waiting queue takes many addresses.

The order is Gradio's only while nobody waits; the Redis fair queue (``worker/``) still decides whose job runs.
"""
from __future__ import annotations

import math
import time
from collections import Counter

from ui.identity import ClientAddresses
from worker.lua import GROUP_USAGE_CAP_S, GROUP_USAGE_HALF_LIFE_S, GROUP_USAGE_WEIGHT

TOO_MANY_WAITING = ("Too many requests from your network are waiting for the page. Wait for one to finish, then "
                    "try again.")


class SlotUsage:
    """Per address, the seconds its answers streamed, halving every ``GROUP_USAGE_HALF_LIFE_S``."""

    # Past this many addresses, those whose usage has decayed below a second are forgotten (memory stays bounded).
    MAX_ADDRESSES = 4096

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._held: dict[str, tuple[float, float]] = {}  # address -> (seconds, when)

    def charge(self, address: str, seconds: float) -> None:
        now = self._clock()
        self._held[address] = (self.of(address) + seconds, now)
        if len(self._held) > self.MAX_ADDRESSES:
            self._held = {a: held for a, held in self._held.items() if self._decayed(held, now) >= 1.0}

    def of(self, address: str) -> float:
        held = self._held.get(address)
        return self._decayed(held, self._clock()) if held else 0.0

    def delay(self, address: str) -> float:
        """How much later than its arrival a waiting event of ``address`` lines up."""
        return min(GROUP_USAGE_WEIGHT * self.of(address), GROUP_USAGE_CAP_S)

    @staticmethod
    def _decayed(held: tuple[float, float], now: float) -> float:
        seconds, when = held
        return seconds * math.pow(0.5, max(0.0, now - when) / GROUP_USAGE_HALF_LIFE_S)


def share_event_slots_fairly(page, addresses: ClientAddresses, max_waiting: int, usage: SlotUsage) -> None:
    """Patch ``page``'s Gradio queue (after ``page.queue()``): fair pick of the next event (``usage``: what the
    page's answers charge), per-address waiting cap."""
    queue = page._queue
    queue.owlet_usage = usage

    def address_of(event) -> str:
        address = getattr(event, "owlet_address", None)
        if address is None:
            address = event.owlet_address = addresses.of(event.request)
        return address

    pick = queue.get_events

    def get_events():
        """Gradio's pick, after moving to the front of each waiting line the event whose address runs the fewest
        events, the earliest by arrival plus its address's usage delay among those. Gradio calls this under its
        queue lock."""
        running = Counter(address_of(event) for job in queue.active_jobs if job for event in job)
        for line in queue.event_queue_per_concurrency_id.values():
            waiting = line.queue
            if len(waiting) > 1:
                delays = {address: usage.delay(address) for address in {address_of(e) for e in waiting}}

                def place(i):
                    address = address_of(waiting[i])
                    return running[address], getattr(waiting[i], "enqueue_time", 0.0) + delays[address], i
                first = min(range(len(waiting)), key=place)
                if first:
                    waiting.insert(0, waiting.pop(first))
        return pick()

    push = queue.push

    async def push_unless_too_many_waiting(body, request, username):
        address = addresses.of(request)
        waiting = sum(address_of(event) == address
                      for line in queue.event_queue_per_concurrency_id.values() for event in line.queue)
        if waiting >= max_waiting:
            return False, TOO_MANY_WAITING, "queue_full"
        return await push(body=body, request=request, username=username)

    queue.get_events = get_events
    queue.push = push_unless_too_many_waiting
