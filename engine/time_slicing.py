"""Time slicing: who gets the engine's decode rows when more answers are held than there are rows.

Without it, an answer keeps its row until it ends, so a few clients with long answers (1,024 tokens) can hold
every row and a newcomer waits for the first of them to finish. With it, rows are shared by client group (the
address or login the worker names for the request), max-min fair:

- a free row goes to the waiting answer whose group holds the fewest rows; on a tie, an answer that has not
  started yet goes before paused ones (its first token is what a newcomer waits for, and behind a dozen paused
  answers' slices that wait is seconds), unless a paused answer has already let
  ``OVERTAKE_LIMIT`` such newcomers go first, so a stream of short questions cannot starve it; then the earliest;
- when no row is free, a waiting answer whose group holds fewer rows than some other group takes a row of that
  other group: the one of its answers that has decoded the most tokens since it last joined, and only once that
  answer has decoded ``quantum`` tokens in this slice, so rows do not thrash and every pause is paid for by a
  slice's worth of progress. The paused answer queues again behind the ones already waiting: with equal groups
  (thirty clients, one answer each, sixteen rows) the rows go round, a slice each.

Answers of one group never pause each other, and ``group=None`` is one shared group, so a benchmark's anonymous
burst runs exactly as without time slicing. Pausing copies the row's cache out exactly and resuming copies it
back (the engine does both), so an answer's tokens do not depend on how often it was paused.

This module is policy only: plain functions over requests' ``group``, ``slice_tokens``, ``output_ids``,
``slicing.overtaken`` (``engine.request.TimeSlice``) and queue order.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

# How many not-yet-started answers a paused answer lets go before it (among groups holding equally few rows).
OVERTAKE_LIMIT = 8


def rows_by_group(requests: Iterable) -> Counter:
    """Rows (running or prefilling) each group holds now."""
    return Counter(r.group for r in requests)


def behind_newcomers(req) -> bool:
    """A paused answer that still lets not-yet-started answers of equally served groups go first."""
    return bool(req.output_ids) and req.slicing.overtaken < OVERTAKE_LIMIT


def next_in_line(waiting: Sequence, rows: Counter):
    """The waiting request that gets the next free row: its group holds the fewest rows, then a not-yet-started
    one (or a paused one that has let enough of them go first), then the earliest."""
    best, best_key = None, None
    for position, req in enumerate(waiting):
        key = (rows[req.group], behind_newcomers(req), position)
        if best_key is None or key < best_key:
            best, best_key = req, key
    return best


def rows_to_pause(running: Sequence, prefilling: Sequence, waiting: Sequence, max_rows: int,
                  quantum: int) -> list:
    """The running requests to pause this step so that waiting groups with fewer rows get theirs.

    Walks the waiting requests in the order the scheduler will admit them (``next_in_line``), counting the rows
    each would take: free rows first, then rows given up by a richer group's answer that has used its slice.
    Stops at the first waiting request no row can be found for (later ones' groups hold at least as many).
    """
    if quantum <= 0 or not waiting or not running:
        return []
    rows = rows_by_group(list(running) + list(prefilling))
    free = max_rows - len(running) - len(prefilling)
    queue, victims = list(waiting), []
    while queue:
        req = next_in_line(queue, rows)
        queue.remove(req)
        if free > 0:
            free -= 1
        else:
            victim = _richest_spent_row(running, victims, rows, rows[req.group], quantum)
            if victim is None:
                break
            victims.append(victim)
            rows[victim.group] -= 1
        rows[req.group] += 1
    return victims


def _richest_spent_row(running: Sequence, taken: list, rows: Counter, poorer: int, quantum: int):
    """Among rows that used their slice and whose group holds more than ``poorer`` rows: the richest group's,
    then the one that has run longest in its slice. None if there is no such row."""
    best, best_key = None, None
    for req in running:
        if req in taken or req.slice_tokens < quantum or rows[req.group] <= poorer:
            continue
        key = (rows[req.group], req.slice_tokens)
        if best_key is None or key > best_key:
            best, best_key = req, key
    return best
