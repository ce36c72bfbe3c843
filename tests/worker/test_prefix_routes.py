"""Prefix routing (worker.queue.prefix_routes): a first question goes to a worker announcing its prompt's prefix,
only while that worker has a free slot; keys name prefixes by messages, never by conversation."""
from __future__ import annotations

import hashlib

from tests.worker.live import png
from worker.store.jobs import Message
from worker.store.keys import JobField, Keys
from worker.queue.prefix_routes import HeldRoutes, route_keys

PICTURE = png((10, 120, 200))
SHA = hashlib.sha256(PICTURE).hexdigest()


def test_keys_name_the_prompt_not_the_conversation():
    example = route_keys([Message("user", "What is in it?", SHA)])
    assert len(example) == 2 and example == route_keys([("user", "What is in it?", SHA)])
    other_question = route_keys([Message("user", "Which colour?", SHA)])
    assert other_question[0] != example[0] and other_question[1] == example[1]  # the same picture
    assert route_keys([Message("user", "What is in it?")]) != example[:1]  # no picture: another prompt
    assert len(route_keys([Message("user", "hi")])) == 1
    follow_up = [Message("user", "What is in it?", SHA), Message("assistant", "A square."), Message("user", "And?")]
    assert route_keys(follow_up) == []


def test_held_routes_keep_the_most_recent():
    held = HeldRoutes(limit=3)
    for i in range(5):
        held.add([f"k{i}"])
    held.add(["k2"])
    assert held.recent() == ["k3", "k4", "k2"]


def _target(client, r, settings, text: str) -> str:
    submitted = client.submit("ann", None, text, image=PICTURE)
    return r.hget(Keys(settings.key_prefix).job(submitted.job), JobField.target).decode()


def test_a_first_question_goes_to_a_worker_holding_its_prefix(client, r, settings, fake_capacity):
    keys = route_keys([Message("user", "What is in it?", SHA)])
    fake_capacity(2, name="cold@test")
    fake_capacity(2, name="warm@test", prefixes=keys[1:])  # it saw the picture, asked otherwise
    assert _target(client, r, settings, "What is in it?") == "warm@test"
    assert client.health()["prefix_route_hits"] == 1


def test_a_full_holder_is_passed_over(client, r, settings, fake_capacity):
    keys = route_keys([Message("user", "What is in it?", SHA)])
    fake_capacity(2, name="cold@test")
    fake_capacity(2, name="warm@test", prefixes=keys, running=2)
    assert _target(client, r, settings, "What is in it?") == ""  # the shared queue: whoever is free takes it
