"""A visitor behind a crowd, in a real browser: the tab shows its place in line and a time, both go down, and the
answer follows.

The stack's worker answers one question at a time (one decode row, no time slicing: the engine holds one answer),
so other users' long answers (ignore_eos) fill it and the rest wait in line; each comes from its own client group,
as different addresses would, and none has used the workers yet, like the visitor, so the visitor waits behind all
of them. The tiny model is fast, so the answers' length is set from its measured speed: about two seconds each.
"""
from __future__ import annotations

import os
import re
import time

import pytest

from tests.ui.page_geometry import DESKTOP
from tests.ui.stack import ARTIFACTS, running_stack, tiny_model
from tests.ui.test_browser import BOT, CHROMIUM
from ui.shared import wording
from worker.client import OwletClient
from worker.config import Settings
from worker.store.keys import SlotsField

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

CROWD = 4  # other users' answers: one running, three waiting ahead of the visitor
ANSWER_S = 2.0  # how long each of them takes
PLACE = re.compile(r"You are (next|\d+)(?:st|nd|rd|th)? in line, about (\d+) s")


@pytest.fixture(scope="module")
def one_at_a_time():
    env = {"OWLET_MAX_RUNNING": "1", "OWLET_TIME_SLICE_TOKENS": "0", "OWLET_UI_QUEUE_POLL_S": "0.2",
           "OWLET_HEARTBEAT_INTERVAL_S": "0.25", "OWLET_HEARTBEAT_TTL_S": "3", "OWLET_UI_MAX_NEW_TOKENS": "8"}
    with running_stack("ui-queue", tiny_model(), env, worker_concurrency=2) as stack:
        client = OwletClient(settings=Settings.from_env(redis_url=stack.redis_url, key_prefix=stack.prefix))
        try:
            yield stack, client
        finally:
            client.close()


def long_answer(client: OwletClient, who: int, tokens: int) -> str:
    """Another user's question, from an address of its own, whose answer is ``tokens`` long; returns its job."""
    return client.submit(f"anon:other{who}", None, f"Talk for a while, {who}.", group=f"addr:203.0.113.{who}",
                         sampling={"max_new_tokens": tokens, "ignore_eos": True}).job


def finished(client: OwletClient, job: str) -> dict:
    """The job's events by type, once it has ended."""
    return {event["type"]: event for _, event in client.events(job)}


def tokens_for(client: OwletClient, seconds: float) -> int:
    """How many tokens the worker writes in ``seconds`` (one answer at a time), from a probe answer."""
    probe = 200
    events = finished(client, long_answer(client, 100, probe))
    took = events["done"]["t"] - events["started"]["t"]
    return max(50, int(probe * seconds / max(took, 1e-3)))


def place_and_time(status: str) -> tuple[int, int] | None:
    found = PLACE.search(status)
    if found is None:
        return None
    return (1 if found[1] == "next" else int(found[1])), int(found[2])


def test_a_visitor_behind_a_crowd_sees_place_and_time_go_down_then_the_answer(one_at_a_time, chromium):
    stack, client = one_at_a_time
    tab = chromium.new_context(viewport=DESKTOP).new_page()  # loaded first: the crowd's answers are short
    tab.goto(stack.url)
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    tokens = tokens_for(client, ANSWER_S)
    # The queue's ETA rests on a moving average of service times: start it from one answer like the crowd's, not
    # from the short probe.
    client.r.hdel(client.keys.slots, SlotsField.service_s)
    finished(client, long_answer(client, 101, tokens))
    crowd = [long_answer(client, i + 1, tokens) for i in range(CROWD)]
    deadline = time.monotonic() + 30
    while client.job_state(crowd[0]) != "started":
        assert time.monotonic() < deadline, "the first of the crowd never started"
        time.sleep(0.05)
    tab.locator("#owlet-input textarea").fill("Am I in line?")
    tab.locator("#owlet-input textarea").press("Enter")
    shown: list[tuple[int, int]] = []  # (place, seconds) as the status line showed them, in order
    bubbles: list[str] = []
    deadline = time.monotonic() + 60 + CROWD * 4 * ANSWER_S
    while True:
        assert time.monotonic() < deadline, f"no answer; the tab showed {shown}"
        status = tab.locator("#owlet-status").inner_text()
        seen = place_and_time(status)
        if seen and (not shown or shown[-1] != seen):
            shown.append(seen)
            bubbles.append(tab.locator(BOT).last.inner_text())
            if len(shown) == 1:
                ARTIFACTS.mkdir(exist_ok=True)
                tab.screenshot(path=str(ARTIFACTS / "ui-queue-place.png"))
        if "Answered in" in status and not tab.locator("#owlet-input textarea").is_disabled():
            break
        assert wording.WARNING_MARK not in status, status
        time.sleep(0.05)

    places = [place for place, _ in shown]
    assert places[0] >= 3, f"the visitor waited behind the crowd: {shown}"
    assert len(set(places)) >= 3 and places == sorted(places, reverse=True), f"the place goes down: {shown}"
    assert places[-1] == 1, f"and reaches the front: {shown}"
    assert shown[0][1] > shown[-1][1] >= 1, f"the time goes down: {shown}"
    assert all(b.startswith(wording.WAITING_MARK) and "in line" in b for b in bubbles), bubbles
    final = tab.locator(BOT).last.inner_text().strip()
    assert final and not final.startswith(wording.WAITING_MARK), "the answer followed in the same bubble"
    for job in crowd:
        assert client.job_state(job) == "done"
