"""Gradio's event slots shared fairly between client addresses.

Gradio runs at most ``max_threads`` events at once (its queue's slots) and gives each free slot to the oldest
waiting event. An answer stream holds its slot until the answer ends, so sixteen addresses, each at its limit of
four events (``address_max_events``), held all 64 slots, and a new visitor's question waited behind the events
they kept resubmitting: 51 s to a first token that the worker produced in 0.05 s (a hostile audit, 2026-12-03,
answers of 1,024 tokens). And waiting events had no per-address limit at all, so one address could fill Gradio's
whole waiting queue (``queue_max_size``), after which every join was refused "Queue is full".

So:

- a free slot goes to the oldest waiting event of the address running the fewest events (arrival order among
  equals): a visitor running nothing waits for the next slot to come free, not behind everyone else's backlog;
- an address may have at most ``max_waiting`` events waiting; one more is refused at once with a sentence
  (HTTP 503, as Gradio refuses a full queue), so filling the waiting queue takes many addresses.

The order is Gradio's only while nobody waits; the Redis fair queue (``worker/``) still decides whose job runs.
"""
from __future__ import annotations

from collections import Counter

from ui.identity import ClientAddresses

TOO_MANY_WAITING = ("Too many requests from your network are waiting for the page. Wait for one to finish, then "
                    "try again.")


def share_event_slots_fairly(page, addresses: ClientAddresses, max_waiting: int) -> None:
    """Patch ``page``'s Gradio queue (after ``page.queue()``): fair pick of the next event, per-address waiting cap."""
    queue = page._queue

    def address_of(event) -> str:
        address = getattr(event, "owlet_address", None)
        if address is None:
            address = event.owlet_address = addresses.of(event.request)
        return address

    pick = queue.get_events

    def get_events():
        """Gradio's pick, after moving to the front of each waiting line the oldest event of the address that
        runs the fewest events. Gradio calls this under its queue lock."""
        running = Counter(address_of(event) for job in queue.active_jobs if job for event in job)
        for line in queue.event_queue_per_concurrency_id.values():
            waiting = line.queue
            if len(waiting) > 1:
                first = min(range(len(waiting)), key=lambda i: (running[address_of(waiting[i])], i))
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
