"""The fair line (worker/queue/lua/line.lua) serves in the order of a rotating ring of client groups, and every
position it tells is the order POP then serves.

``RingModel`` is that order written plainly, the way a reader would state the policy: a list of groups, waiting
groups ahead of served ones (by when they started waiting), each group's identities round robin, a served group
moving to the end of the ring each time it is served, a served group that waits again going first among the
served, a group put back after a lost worker (with nothing else waiting) going ahead of everyone. Random sequences of submits, pops, finishes,
cancels and requeues run through the real scripts and through the model side by side; after every step each
queued job's position must equal the model's, and POP must serve the model's next job.

Setbacks for recent use are turned off here (weight 0), so a group's key is when it started waiting and the model
needs no clock; tests/worker/test_queue.py covers the setback.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

import worker.queue.scripts as scripts
from tests.redis_server import unique_prefix
from tests.worker.queue_state import line_index_errors
from worker.client import OwletClient
from worker.config import Settings
from worker.queue.fairness import FIFO_QUEUE
from worker.store.keys import JobField, JobState


class RingModel:
    def __init__(self):
        self.ring: list[str] = []  # groups with queued jobs, in service order
        self.tier: dict[str, int] = {}  # group in the ring -> 0 put back first, 1 waiting, 2 served
        self.served: set[str] = set()  # served in this busy period (queued or in flight)
        self.identities: dict[str, list[str]] = {}  # group -> its identities with queued jobs, round robin
        self.jobs: dict[str, list[str]] = {}  # identity -> its queued jobs, oldest first
        self.in_flight: dict[str, int] = {}  # group -> jobs in flight

    def submit(self, job: str, user: str, group: str) -> None:
        self.jobs.setdefault(user, []).append(job)
        who = self.identities.setdefault(group, [])
        if user not in who:
            who.append(user)
        if group not in self.ring:  # starts waiting: behind the waiting, first among the served
            at = next((i for i, g in enumerate(self.ring) if self.tier[g] == 2), len(self.ring))
            self.ring.insert(at, group)
            self.tier[group] = 2 if group in self.served else 1

    def order(self) -> list[str]:
        """Every queued job in the order the ring serves them."""
        ring = [(g, [list(self.jobs[u]) for u in self.identities[g]]) for g in self.ring]
        out = []
        while ring:
            group, lists = ring.pop(0)
            out.append(lists[0].pop(0))
            lists = lists[1:] + ([lists[0]] if lists[0] else [])
            if lists:
                ring.append((group, lists))
        return out

    def serve(self) -> str | None:
        if not self.ring:
            return None
        group = self.ring.pop(0)
        user = self.identities[group].pop(0)
        job = self.jobs[user].pop(0)
        if self.jobs[user]:
            self.identities[group].append(user)
        self.served.add(group)
        self.in_flight[group] = self.in_flight.get(group, 0) + 1
        if self.identities[group]:  # to the end of the ring
            self.ring.append(group)
            self.tier[group] = 2
        return job

    def _idle(self, group: str) -> None:
        if not self.in_flight.get(group) and group not in self.ring:
            self.served.discard(group)

    def finish(self, group: str) -> None:
        self.in_flight[group] -= 1
        self._idle(group)

    def cancel(self, job: str, user: str, group: str) -> None:
        self.jobs[user].remove(job)
        if not self.jobs[user]:
            self.identities[group].remove(user)
        if not self.identities[group]:
            self.ring.remove(group)
            self._idle(group)

    def requeue(self, job: str, user: str, group: str) -> None:
        """A lost worker's job: first in its identity's queue; its group, if it had nothing waiting, first of all."""
        self.finish(group)
        self.jobs.setdefault(user, []).insert(0, job)
        who = self.identities.setdefault(group, [])
        if user not in who:
            who.insert(0, user)
        if group not in self.ring:
            self.ring.insert(0, group)
            self.tier[group] = 0


@pytest.fixture
def unweighted_client(redis_url, monkeypatch):
    monkeypatch.setattr(scripts, "GROUP_USAGE_WEIGHT", 0)  # no setback: keys are when groups started waiting
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("line"), user_queue_cap=1000,
                                 global_queue_cap=10_000, group_job_cap=1000, group_submit_limit=10_000,
                                 max_attempts=1000)
    client = OwletClient(settings=settings)
    yield client
    client.close(purge=True)


@pytest.mark.parametrize("seed", range(6))
def test_the_line_serves_as_a_rotating_ring_of_groups_and_says_so(unweighted_client, seed):
    client, model, rng = unweighted_client, RingModel(), random.Random(seed)
    owner: dict[str, tuple[str, str]] = {}  # job -> (identity, group)
    queued: list[str] = []
    flying: list[str] = []
    for step in range(150):
        op = rng.random()
        if op < 0.45:
            group = f"g{rng.randrange(5)}"
            user = f"{group}-u{rng.randrange(3)}"
            job = client.submit(user, None, f"q{step}", group=group).job
            owner[job] = (user, group)
            model.submit(job, user, group)
            queued.append(job)
        elif op < 0.7:
            expected = model.serve()
            popped = client.jobs.pop(10 ** 6)
            assert (popped and popped[0]) == expected, f"step {step}: POP served another job than the ring"
            if expected:
                queued.remove(expected)
                flying.append(expected)
        elif op < 0.82 and flying:
            job = flying.pop(rng.randrange(len(flying)))
            assert client.jobs.finish(job, "done")
            model.finish(owner[job][1])
        elif op < 0.9 and flying:
            job = flying.pop(rng.randrange(len(flying)))
            assert client.jobs.requeue(job, "lost") == 1
            model.requeue(job, *owner[job])
            queued.append(job)
        elif queued:
            job = queued.pop(rng.randrange(len(queued)))
            assert client.jobs.cancel(job)
            model.cancel(job, *owner[job])
        order = model.order()
        assert client.queue_positions(order) == {job: i + 1 for i, job in enumerate(order)}, f"step {step}"
        assert not line_index_errors(client), f"step {step}: {line_index_errors(client)}"


@pytest.mark.parametrize("seed,fifo", [(11, False), (12, False), (13, False), (14, True)])
def test_the_job_pop_serves_next_is_the_one_told_it_is_first(settings, seed, fifo):
    """With slots beyond the decode rows (kept for groups with nothing in flight, the last ones for light groups)
    and real usage setbacks, a job told position 1 is the one POP (or a worker's take) serves next, at every step,
    through cancels and jobs put back after a lost worker; and the index of groups with nothing in flight holds
    exactly those groups in line, at their places (in FIFO mode, the one shared group, which counts nothing in
    flight, whenever anything waits)."""
    client = OwletClient(settings=dataclasses.replace(settings, fifo=fifo))
    try:
        serve_and_check(client, random.Random(seed))
    finally:
        client.close(purge=True)


def serve_and_check(client, rng):
    queued, flying = [], []
    for step in range(160):
        op = rng.random()
        if op < 0.45:
            group = f"g{rng.randrange(6)}"
            # now and then an identity asks from another group than its own (its address changed)
            home = group if rng.random() < 0.8 else f"g{rng.randrange(6)}"
            queued.append(client.submit(f"{home}-u{rng.randrange(2)}", None, f"q{step}", group=group).job)
        elif op < 0.72:
            places = client.queue_positions(queued)
            first = {job for job, place in places.items() if place == 1}
            if rng.random() < 0.5:
                popped = client.jobs.pop(8, 3)
                popped = popped and popped[0]
            else:
                taken = client.jobs.take(8, 3, "worker@host")
                # (a job POP dispatched that no worker claimed yet starts first: it is in flight already)
                popped = taken and taken.job not in flying and taken.job
            if popped:
                assert popped in first, f"step {step}: POP served a job told {places[popped]}"
                queued.remove(popped)
                flying.append(popped)
        elif op < 0.84 and flying:
            assert client.jobs.finish(flying.pop(rng.randrange(len(flying))), "done")
        elif op < 0.87 and flying:  # its user stops it: a dispatched job ends at once, a started one is flagged
            job = rng.choice(flying)
            assert client.jobs.cancel(job)
            if client.job_state(job) == "cancelled":
                flying.remove(job)
        elif op < 0.93 and flying:
            job = flying.pop(rng.randrange(len(flying)))
            back = client.jobs.requeue(job, "lost")
            assert back in (1, 2, 3), "queued again, failed once its attempts are spent, or cancelled as flagged"
            if back == 1:
                queued.append(job)
        elif op < 0.96 and queued:  # it waited past its timeout (the reaper ends it)
            assert client.jobs.finish(queued.pop(rng.randrange(len(queued))), "error", only_state="queued")
        elif queued:
            assert client.jobs.cancel(queued.pop(rng.randrange(len(queued))))
        assert not line_index_errors(client), f"step {step}: {line_index_errors(client)}"
    # everything ends: nothing of the line or its counters is left behind
    for job in queued:
        assert client.jobs.cancel(job)
    for job in flying:
        client.jobs.finish(job, "done")
    keys = client.keys
    for key in (keys.line, keys.places, keys.idle_line, keys.light_line, keys.waiting_since, keys.queued_by_group,
                keys.inflight_by_group, keys.queued_by_user, keys.queued_since, keys.inflight):
        assert not client.r.exists(key), f"{key} left behind: {client.r.type(key)}"


def test_questions_waiting_in_the_lines_earlier_form_are_put_in_line_in_its_order(unweighted_client):
    """A deployment upgraded while people wait: the earlier line kept only lists (groups in a ring list, each group's
    identities, each identity's jobs). ADOPT_LINE puts them in the line in that order, and a second run does
    nothing."""
    client, r, keys = unweighted_client, unweighted_client.r, unweighted_client.keys
    model = RingModel()
    lists = {"g1": {"g1-a": ["j1", "j3"], "g1-b": ["j2"]}, "g2": {"g2-a": ["j4"]}, "g3": {"g3-a": ["j5", "j6"]}}
    for group in ("g2", "g1", "g3"):  # the order the old ring held them in
        r.rpush(keys.legacy_ring, group)
        for user, jobs in lists[group].items():
            r.rpush(keys.group_queue(group), user)
            for job in jobs:
                r.hset(keys.job(job), mapping={JobField.state: JobState.queued, JobField.user: user,
                                               JobField.qkey: user, JobField.group: group, JobField.qgroup: group})
                r.rpush(keys.user_queue(user), job)
                model.submit(job, user, group)
    r.hset(keys.legacy_ring_keys, "g2", "1")
    r.sadd(keys.legacy_served, "g9")
    r.set(keys.legacy_service_time, "12.5")  # the service-time average's earlier key (KEY.slots keeps it now)
    r.set(keys.legacy_queued_count, "99")  # the waiting count earlier versions kept (the line's size is the count)
    r.hset(keys.legacy_group_usage, mapping={"g1": "3.0:1.0", "g8": "1.0:1.0"})  # every group's usage, in one hash
    r.hset(keys.legacy_idle_members, "g8", "x")  # each idle group's member (its place names it now)
    assert client.jobs.adopt_line() == 3
    assert client.jobs.adopt_line() == 0, "a second run finds nothing to do"
    assert not r.exists(keys.legacy_ring) and not r.exists(keys.legacy_ring_keys) and not r.exists(keys.legacy_served)
    assert not r.exists(keys.legacy_service_time) and not r.exists(keys.legacy_queued_count)
    assert not r.exists(keys.legacy_group_usage) and not r.exists(keys.legacy_idle_members)
    assert client.readouts.queued_total() == sum(len(jobs) for users in lists.values() for jobs in users.values())
    order = model.order()
    assert order[:3] == ["j4", "j1", "j5"] and client.queue_positions(order) == {j: i + 1 for i, j in enumerate(order)}
    assert [client.jobs.pop(100)[0] for _ in order] == order



def test_fifo_questions_waiting_in_the_earlier_lists_keep_their_order_when_adopted(settings):
    """FIFO mode's shared group kept its waiting jobs in the lists every group has (a cancel scanned them all): a
    deployment upgraded while people wait in it moves them to the sorted set it keeps now (ADOPT_LINE), in the lists'
    order (a job put back first), whatever tags the line held them by, and later questions queue behind them."""
    client = OwletClient(settings=dataclasses.replace(settings, fifo=True))
    r, keys = client.r, client.keys
    try:
        place = "1" + "0" * 33  # a waiting group's place, as the line writes it (PLACE_WIDTH characters)
        earlier = ["back", "a1", "a2", "a3"]  # "back" was put back after a lost worker: it heads the lists
        tags = {"back": -9, "a1": 0, "a2": 1, "a3": 2}  # the tags of the earliest line (ranks; a job put back: negative)
        for job in earlier:
            r.hset(keys.job(job), mapping={JobField.state: JobState.queued, JobField.user: f"u-{job}",
                                           JobField.qkey: FIFO_QUEUE, JobField.group: f"g-{job}",
                                           JobField.qgroup: FIFO_QUEUE})
            r.hincrby(keys.queued_by_group, f"g-{job}", 1)
            r.hincrby(keys.queued_by_user, f"u-{job}", 1)
            r.rpush(keys.user_queue(FIFO_QUEUE), job)
            r.zadd(keys.line, {place + job: tags[job]})
        r.rpush(keys.group_queue(FIFO_QUEUE), FIFO_QUEUE)
        r.hset(keys.places, FIFO_QUEUE, place)
        r.zadd(keys.waiting_since, {FIFO_QUEUE: 1.0})  # (a group waiting with a key, as its place's tier says)
        r.set(keys.line_seq, 3)  # fewer arrivals counted than the ranks above: a fresh tag would have gone first
        assert client.jobs.adopt_line() == 0, "no group of the ring's earlier form"
        assert not r.exists(keys.user_queue(FIFO_QUEUE)) and not r.exists(keys.group_queue(FIFO_QUEUE))
        later = client.submit("late", None, "me too", group="addr:late").job
        order = earlier + [later]
        assert client.queue_positions(order) == {job: i + 1 for i, job in enumerate(order)}
        assert not line_index_errors(client), line_index_errors(client)
        assert client.jobs.cancel("a2")
        order.remove("a2")
        assert client.jobs.adopt_line() == 0 and client.queue_positions(order) == {j: i + 1 for i, j in enumerate(order)}
        assert [client.jobs.pop(100)[0] for _ in order] == order
        assert not r.exists(keys.fifo_line) and not r.exists(keys.line) and not line_index_errors(client)
    finally:
        client.close(purge=True)

def test_an_identity_that_asks_from_a_new_address_while_it_waits_stays_in_one_place_in_line(settings, fake_capacity):
    """An anonymous visitor's group is its address, and addresses change under a visitor: a phone moves from Wi-Fi to
    its carrier, a dual-stack browser reaches the page over IPv4 then IPv6, an API key is used from two machines.
    Such an identity asking again while its first question waits had its question appended to its own queue, which
    waits in its first address's turn, while the line looked for it under the new address: SUBMIT failed half-way
    (a Lua error after its writes) and left a job no one followed. Now every question an identity has waiting waits
    in the group its queue joined; so does one put back after a lost worker; each is told its place, is served in
    that order, and the line's indexes stay exact."""
    client = OwletClient(settings=settings)
    try:
        first = client.submit("mover", None, "from the wifi", group="addr:wifi").job
        other = client.submit("stayer", None, "hello", group="addr:other").job
        moved = client.submit("mover", None, "from the carrier", group="addr:carrier").job
        assert not line_index_errors(client), line_index_errors(client)
        assert client.queue_positions([first, other, moved]) == {first: 1, other: 2, moved: 3}
        assert client.r.hget(client.keys.job(moved), JobField.qgroup) == b"addr:wifi", "waits in its queue's group"
        assert client.r.hget(client.keys.job(moved), JobField.group) == b"addr:carrier", "charged to where it asked"
        assert client.jobs.pop(100)[0] == first
        # while its second question waits, the first is put back (its worker was lost): ahead of it in its queue, in
        # the first address's turn, which was served (so behind the other group's)
        assert client.jobs.requeue(first, "lost") == 1
        assert not line_index_errors(client), line_index_errors(client)
        assert client.queue_positions([first, other, moved]) == {other: 1, first: 2, moved: 3}
        assert [client.jobs.pop(100)[0] for _ in range(3)] == [other, first, moved]
        assert not line_index_errors(client), line_index_errors(client)
        # the identity asks from yet another address while one of its questions is in flight and none waits: a new
        # queue, in that address's group; the one in flight put back joins it there
        third = client.submit("mover", None, "from the train", group="addr:train").job
        assert client.jobs.requeue(moved, "lost") == 1
        assert client.r.hget(client.keys.job(moved), JobField.qgroup) == b"addr:train"
        assert not line_index_errors(client), line_index_errors(client)
        assert client.queue_positions([moved, third]) == {moved: 1, third: 2}
        assert [client.jobs.pop(100)[0] for _ in range(2)] == [moved, third]
        for job in (first, other, moved, third):
            assert client.jobs.finish(job, "done")
        assert not line_index_errors(client) and client.readouts.queued_total() == 0
        assert not client.r.hgetall(client.keys.inflight_by_group) and not client.r.hgetall(client.keys.queued_by_group)
    finally:
        client.close(purge=True)


@pytest.mark.parametrize("seed", [21, 22])
def test_fifo_mode_serves_in_arrival_order_through_cancels_and_jobs_put_back(settings, seed):
    """FIFO mode (the benchmarks' baseline) tags its one shared group's jobs by arrival: POP serves the oldest, a job
    put back after a lost worker goes ahead of all (the latest put back first), a cancelled one leaves the others'
    order as it was, and every job's place is its index in that order, at every step."""
    client = OwletClient(settings=dataclasses.replace(settings, fifo=True, user_queue_cap=50, group_job_cap=50,
                                                          max_attempts=1000))
    rng, order, flying = random.Random(seed), [], []
    try:
        for step in range(200):
            op = rng.random()
            if op < 0.45:
                who = f"v{rng.randrange(8)}"
                order.append(client.submit(who, None, f"q{step}", group=f"addr-{who}").job)
            elif op < 0.7 and order:
                popped = client.jobs.pop(10 ** 6)
                assert popped and popped[0] == order[0], f"step {step}: served {popped}, the oldest is {order[0]}"
                flying.append(order.pop(0))
            elif op < 0.8 and flying:
                job = flying.pop(rng.randrange(len(flying)))
                assert client.jobs.requeue(job, "lost") == 1
                order.insert(0, job)
            elif op < 0.9 and order:
                assert client.jobs.cancel(order.pop(rng.randrange(len(order))))
            elif flying:
                assert client.jobs.finish(flying.pop(rng.randrange(len(flying))), "done")
            assert client.queue_positions(order) == {job: i + 1 for i, job in enumerate(order)}, f"step {step}"
            assert not line_index_errors(client), f"step {step}: {line_index_errors(client)}"
    finally:
        client.close(purge=True)
