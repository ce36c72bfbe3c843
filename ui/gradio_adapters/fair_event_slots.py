"""Gradio's event slots shared fairly between client addresses.

Gradio runs at most ``max_threads`` events at once (its queue's slots) and gives each free slot to the oldest waiting
event. An answer stream holds its slot until the answer ends, so sixteen addresses, each at its limit of four events
(``address_max_events``), held all 64 slots, and a new visitor's question waited behind the events they kept
resubmitting: 51 s to a first token that the worker produced in 0.05 s (answers of 1,024 tokens). And waiting events had
no per-address limit at all, so one address could fill Gradio's whole waiting queue (``queue_max_size``), after which
every join was refused "Queue is full".

So:

- a free slot goes to the waiting event of the address running the fewest events: a visitor running nothing waits
  for the next slot to come free, not behind everyone else's backlog;
- among addresses running equally many, an address's recent use of the slots counts against it, as the worker's
  queue counts a client group's time in flight (worker/queue/fairness.py: same half-life, weight, bound): an event
  lines up as if it had arrived ``GROUP_USAGE_WEIGHT x usage`` later, at most ``GROUP_USAGE_CAP_S`` or the
  longest time an event has waited now, whichever is larger. ``usage`` is the seconds its address's answers
  streamed (first token to end, charged by ui/chat/streaming.py), halved every ``GROUP_USAGE_HALF_LIFE_S``. Not the
  seconds its events held slots: a visitor whose first answer waited in the workers' queue while holding its slot
  would then be set back for its follow-up. Without it a crowd address whose answer had just ended (so running
  nothing) and which re-asked at once would go before a visitor who arrived a moment later. The bound keeps a
  heavy user's wait to that of the longest-waiting event, and a line longer than the cap does not let a crowd
  that has waited it out stay ahead of every visitor;
- an address may have at most ``max_waiting`` events waiting; one more is refused at once with a sentence
  (HTTP 503, as Gradio refuses a full queue), so filling the waiting queue takes many addresses.

The order is Gradio's only while nobody waits; the Redis fair queue (``worker/``) still decides whose job runs.
"""
from __future__ import annotations

import math
import time
from collections import Counter

from ui.gradio_adapters.internals import (NotAdaptable, Patch, enqueue_time, queue_of, replace, request_of,
                                         require_parameters, require_type, running_events, waiting_lines)
from ui.identity import ClientAddresses
from worker.queue.fairness import GROUP_USAGE_CAP_S, GROUP_USAGE_HALF_LIFE_S, GROUP_USAGE_WEIGHT

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

    def delay(self, address: str, longest_wait_s: float = 0.0) -> float:
        """How much later than its arrival a waiting event of ``address`` lines up, while the longest-waiting
        event has waited ``longest_wait_s``."""
        return min(GROUP_USAGE_WEIGHT * self.of(address), max(GROUP_USAGE_CAP_S, longest_wait_s))

    @staticmethod
    def _decayed(held: tuple[float, float], now: float) -> float:
        seconds, when = held
        return seconds * math.pow(0.5, max(0.0, now - when) / GROUP_USAGE_HALF_LIFE_S)


def share_event_slots_fairly(page, addresses: ClientAddresses, max_waiting: int, usage: SlotUsage) -> list[Patch]:
    """Patch ``page``'s Gradio queue (after ``page.queue()``): fair pick of the next event (``usage``: what the
    page's answers charge), per-address waiting cap."""
    queue = queue_of(page)
    require_parameters(queue, "get_events", ())
    require_parameters(queue, "push", ("body", "request", "username"))
    require_type(queue, "event_queue_per_concurrency_id", dict)
    require_type(queue, "active_jobs", list)
    _check_events()
    queue.owlet_usage = usage

    def address_of(event) -> str:
        address = getattr(event, "owlet_address", None)
        if address is None:
            address = event.owlet_address = addresses.of(request_of(event))
        return address

    pick = queue.get_events

    def get_events():
        """Gradio's pick, after moving to the front of each waiting line the event whose address runs the fewest
        events, the earliest by arrival plus its address's usage delay among those. Gradio calls this under its
        queue lock."""
        running = Counter(address_of(event) for event in running_events(queue))
        for waiting in waiting_lines(queue):
            if len(waiting) > 1:
                longest = time.monotonic() - min(enqueue_time(e) for e in waiting)  # Gradio's clock is monotonic
                delays = {address: usage.delay(address, longest) for address in {address_of(e) for e in waiting}}

                def place(i):
                    address = address_of(waiting[i])
                    return running[address], enqueue_time(waiting[i]) + delays[address], i
                first = min(range(len(waiting)), key=place)
                if first:
                    waiting.insert(0, waiting.pop(first))
        return pick()

    push = queue.push

    async def push_unless_too_many_waiting(body, request, username):
        address = addresses.of(request)
        waiting = sum(address_of(event) == address for line in waiting_lines(queue) for event in line)
        if waiting >= max_waiting:
            return False, TOO_MANY_WAITING, "queue_full"
        return await push(body=body, request=request, username=username)

    return [replace(queue, "get_events", get_events), replace(queue, "push", push_unless_too_many_waiting)]


def _check_events() -> None:
    """Gradio's events carry the request that joined them and when they joined, and its lines are lists."""
    from types import SimpleNamespace

    from gradio.queueing import Event, EventQueue

    request = object()
    event = Event(None, SimpleNamespace(concurrency_id="probe"), request, None)
    if request_of(event) is not request or not isinstance(enqueue_time(event), float):
        raise NotAdaptable("a queue Event keeps its request or its enqueue_time elsewhere")
    require_type(EventQueue("probe", None), "queue", list)
