"""The settings a script reads come as one JSON text the library decodes once and keeps (``Scripts.call``'s
``settings``): each deployment's text keeps its own values, however the calls of several interleave."""
from __future__ import annotations

import dataclasses

import pytest

from worker.client import OwletClient
from worker.errors import UserCapReached


def test_two_deployments_on_one_redis_each_get_their_own_caps_call_after_call(settings):
    strict = OwletClient(settings=dataclasses.replace(settings, user_queue_cap=1))
    loose = OwletClient(settings=dataclasses.replace(settings, user_queue_cap=3))
    try:
        assert strict.jobs._submit_settings() != loose.jobs._submit_settings()
        for turn in range(3):  # the two texts alternate: a kept one must never answer for the other
            if turn == 0:
                strict.submit_turn("ann", strict.new_conversation("ann"), "one")
            else:
                with pytest.raises(UserCapReached, match="1 questions waiting"):
                    strict.submit_turn("ann", strict.new_conversation("ann"), "again")
            loose.submit_turn("bob", loose.new_conversation("bob"), f"question {turn}")
        with pytest.raises(UserCapReached, match="3 questions waiting"):
            loose.submit_turn("bob", loose.new_conversation("bob"), "a fourth")
    finally:
        strict.close(purge=True)
        loose.close(purge=True)


def test_a_changed_budget_is_a_new_text(client):
    before = client.jobs._submit_settings()
    assert client.jobs._submit_settings() is before, "the same text while nothing changed"
    client.jobs.history_budget += 1
    assert client.jobs._submit_settings() != before
