"""The Redis side of the job queue, without a model: submit, positions, fairness, caps, cancel, ownership."""
from __future__ import annotations

import threading
import time

import pytest

from tests.worker.queue_state import set_waiting_key, waiting_key
from worker.errors import ConversationBusy, NotYourConversation, ServiceBusy, UnknownJob, UserCapReached
from worker.store.jobs import Job, Message
from worker.store.keys import JobField, SlotsField


def submit(client, user, text="hi", conv=None):
    conv = conv or client.new_conversation(user)
    return client.submit_turn(user, conv, text), conv


def pop_all(client, capacity=10_000):
    order = []
    while (popped := client.jobs.pop(capacity)):
        order.append(popped[0])
    return order


def test_submit_records_turn_and_queued_event(client):
    job, conv = submit(client, "ann", "what is this?")
    assert client.history("ann", conv) == [{"role": "user", "text": "what is this?", "image_sha": None}]
    assert client.queue_position(job) == 1
    stream_id, event = next(iter(client.events(job)))
    assert event["type"] == "queued" and event["position"] == 1
    assert client.job_state(job) == "queued"


def test_queued_event_carries_an_eta_once_service_times_are_known(client, fake_capacity):
    first, _ = submit(client, "ann")
    assert next(iter(client.events(first)))[1]["eta_s"] is None  # no service time measured yet
    client.r.hset(client.keys.slots, SlotsField.service_s, 2.0)  # the mean FINISH keeps
    fake_capacity(4)
    client.dispatch()  # slots are free now, but the eta only depends on position x service / slots
    job, _ = submit(client, "bob")
    event = next(iter(client.events(job)))[1]
    assert event["eta_s"] == round(event["position"] * 2.0 / 4, 1) and event["eta_s"] > 0


def test_round_robin_under_a_flood(client):
    heavy = [submit(client, "heavy", f"q{i}")[0] for i in range(50)]
    light = {u: submit(client, u)[0] for u in ("b", "c", "d", "e")}
    # each light user is behind at most one heavy job, not fifty
    assert [client.queue_position(light[u]) for u in "bcde"] == [2, 3, 4, 5]
    assert client.queue_position(heavy[-1]) == 54
    order = pop_all(client)
    assert order[:6] == [heavy[0], light["b"], light["c"], light["d"], light["e"], heavy[1]]
    assert sorted(order) == sorted(heavy + list(light.values()))
    assert client.queue_position(heavy[-1]) is None


def test_newcomers_go_ahead_of_a_user_already_being_served(client):
    heavy = [submit(client, "heavy", f"q{i}")[0] for i in range(20)]
    assert pop_all(client, capacity=1) == [heavy[0]]  # heavy has been served in this busy period
    light = [submit(client, u)[0] for u in ("b", "c", "d")]
    assert [client.queue_position(j) for j in light] == [1, 2, 3]
    assert client.queue_position(heavy[1]) == 4
    client.r.delete(client.keys.inflight)  # free the slot the first pop took
    order = pop_all(client)
    assert order[:5] == light + heavy[1:3]


def test_fifo_mode_serves_in_arrival_order(redis_url, settings):
    from worker.client import OwletClient

    fifo = OwletClient(settings=type(settings)(**{**vars(settings), "fifo": True}))
    try:
        heavy = [submit(fifo, "heavy")[0] for _ in range(5)]
        light = submit(fifo, "b")[0]
        assert fifo.queue_position(light) == 6
        assert pop_all(fifo) == heavy + [light]
    finally:
        for k in fifo.r.scan_iter(match=settings.key_prefix + "*"):
            fifo.r.delete(k)


def test_lone_user_may_use_every_slot(client, fake_capacity):
    jobs = [submit(client, "solo")[0] for _ in range(6)]
    fake_capacity(4)
    assert client.dispatch() == 4  # work-conserving: nobody else waits, so one user takes all slots
    assert [client.job_state(j) for j in jobs] == ["dispatched"] * 4 + ["queued"] * 2
    assert client.dispatch() == 0  # and no more than the capacity
    assert client.queue_position(jobs[4]) == 1


def test_no_dispatch_without_live_workers(client):
    job, _ = submit(client, "ann")
    assert client.dispatch() == 0
    assert client.job_state(job) == "queued"


def test_user_cap_and_global_cap(redis_url, settings):
    from worker.client import OwletClient

    c = OwletClient(settings=type(settings)(**{**vars(settings), "user_queue_cap": 2, "global_queue_cap": 3}))
    try:
        submit(c, "ann"), submit(c, "ann")
        with pytest.raises(UserCapReached) as exc:
            submit(c, "ann")
        assert "2 questions waiting" in exc.value.user_message
        submit(c, "bob")
        with pytest.raises(ServiceBusy) as exc:
            submit(c, "cid")
        assert exc.value.user_message == "The service is busy, try again in a moment."
        assert c.readouts.queued_total() == 3
    finally:
        for k in c.r.scan_iter(match=settings.key_prefix + "*"):
            c.r.delete(k)


@pytest.mark.parametrize("fifo", [False, True], ids=["fair line", "fifo"])
def test_the_identity_cap_counts_exactly_what_waits_through_pop_cancel_and_requeue(settings, fifo):
    """The fair line reads an identity's count off its own queue; FIFO mode, one queue for all, keeps a count. Either
    way the cap sees what waits now, after every step that moves a question in or out of line."""
    from worker.client import OwletClient

    c = OwletClient(settings=type(settings)(**{**vars(settings), "user_queue_cap": 2, "fifo": fifo}))

    def refused() -> bool:
        try:
            submit(c, "ann")
        except UserCapReached:
            return True
        return False

    try:
        first, second = submit(c, "ann")[0], submit(c, "ann")[0]
        submit(c, "bob")
        assert refused(), "two wait: the third is refused"
        popped = c.jobs.pop(10)[0]
        assert popped == first
        assert not refused(), "one left the line: one more may wait"
        assert refused()
        assert c.cancel("ann", second) is True
        assert not refused(), "a cancelled question no longer counts"
        assert c.jobs.requeue(popped, "lost") == 1  # its worker was lost: it waits again, and counts again
        assert refused()
        c.jobs.pop(10), c.jobs.pop(10), c.jobs.pop(10), c.jobs.pop(10)
        assert c.readouts.queued_total() == 0
        assert not c.r.hgetall(c.keys.queued_by_user), "nothing left counted once nothing waits"
        assert not refused() and not refused() and refused()
    finally:
        for k in c.r.scan_iter(match=settings.key_prefix + "*"):
            c.r.delete(k)


@pytest.mark.parametrize("fifo", [False, True], ids=["fair line", "fifo"])
def test_the_waiting_room_counts_exactly_what_waits_through_pop_cancel_requeue_and_a_dropped_job(settings, fifo):
    """The global cap reads the line's size, which holds each queued question once: after every step that moves a
    question in or out of line, and a question whose job record expired while it waited, the room has exactly
    the places its cap promises."""
    from worker.client import OwletClient

    c = OwletClient(settings=type(settings)(**{**vars(settings), "global_queue_cap": 3, "fifo": fifo}))

    def refused(who: str) -> bool:
        try:
            submit(c, who)
        except ServiceBusy:
            return True
        return False

    try:
        first, second, third = (submit(c, who)[0] for who in ("ann", "bob", "cid"))
        assert refused("dan"), "three wait: the room is full"
        popped = c.jobs.pop(10)[0]
        assert popped == first and c.readouts.queued_total() == 2
        assert not refused("dan") and refused("eve"), "one left the line: one more may wait"
        assert c.cancel("bob", second) is True and c.readouts.queued_total() == 2
        assert not refused("eve") and refused("fay"), "a cancelled question no longer counts"
        assert c.jobs.requeue(popped, "lost") == 1 and c.readouts.queued_total() == 4
        assert refused("fay"), "a question put back after a lost worker waits again, and counts again"
        c.r.delete(c.keys.job(third))  # its record expired while it waited: POP drops it from the line
        while c.jobs.pop(10) is not None:
            pass
        assert c.readouts.queued_total() == 0 and c.queue_stats()["queued"] == 0
        assert not refused("gus") and not refused("hal") and not refused("ivy") and refused("jon")
    finally:
        for k in c.r.scan_iter(match=settings.key_prefix + "*"):
            c.r.delete(k)


def test_cancel_queued_job_ends_stream_and_frees_the_queue(client):
    job, conv = submit(client, "ann")
    other, _ = submit(client, "bob")
    assert client.cancel("ann", job) is True
    assert [e["type"] for _, e in client.events(job)] == ["queued", "cancelled"]
    assert client.queue_position(job) is None
    assert client.queue_position(other) == 1
    assert client.readouts.queued_total() == 1
    assert client.cancel("ann", job) is False  # already ended
    # the conversation is free again for the next question
    client.submit_turn("ann", conv, "again")


def test_users_cannot_touch_each_others_conversations(client):
    job, conv = submit(client, "ann")
    with pytest.raises(NotYourConversation):
        client.history("mallory", conv)
    with pytest.raises(NotYourConversation):
        client.submit_turn("mallory", conv, "hi")
    with pytest.raises(NotYourConversation):
        client.truncate("mallory", conv, 0)
    with pytest.raises(UnknownJob):
        client.cancel("mallory", job)
    with pytest.raises(NotYourConversation):
        client.submit_turn("ann", "no-such-conversation", "hi")
    assert client.job_state(job) == "queued"


def test_first_answer_finds_only_the_newest_conversation_while_its_first_question_waits(client):
    """What a page reloaded before the browser learned its new conversation's id reopens (ui on_load)."""
    assert client.first_answer("ann") is None
    first = client.submit("ann", None, "a first question")
    assert client.first_answer("ann") == (first.conv, first.job)
    assert client.first_answer("bob") is None, "nobody else's"
    newer = client.submit("ann", None, "another new chat")
    assert client.first_answer("ann") == (newer.conv, newer.job)
    client.cancel("ann", newer.job)
    assert client.first_answer("ann") is None, "no answer being made: nothing to reopen"
    client.submit_turn("ann", newer.conv, "asked again")
    assert client.first_answer("ann") is None, "not its first question: the browser knows this chat already"


def test_newest_since_finds_the_newest_conversation_made_after_a_time_answered_or_not(client):
    """What a page reloaded before the browser remembered its chat reopens (ui on_load): the identity's newest
    conversation, if it was made after the time the browser last remembered one."""
    import time

    before = time.time()
    assert client.newest_since("ann", float("-inf")) is None
    first = client.submit("ann", None, "a first question")
    client.cancel("ann", first.job)  # its answer ended: no first answer being made
    assert client.newest_since("ann", float("-inf")) == first.conv, "a browser that never remembered a chat"
    assert client.newest_since("ann", before) == first.conv
    assert client.newest_since("ann", time.time()) is None, "remembered after it was made: the browser knows"
    assert client.newest_since("bob", float("-inf")) is None, "nobody else's"
    client.r.hset(client.keys.conversation(first.conv), "user", "bob")  # (not ann's any more)
    assert client.newest_since("ann", float("-inf")) is None


def test_leaving_a_conversation_is_recorded_for_its_owner_only_and_never_brings_it_back(client):
    """What "New conversation" records (LEAVE) so a page reloaded before its browser remembers the leaving keeps the
    chat closed: the time, on the owner's conversation only; a conversation gone (expired, cleared) is not made
    again by it, as a plain HSET would (a hash without owner nor TTL)."""
    first = client.submit("ann", None, "a first question")
    assert client.left_at("ann", first.conv) is None
    assert client.leave("ann", first.conv, 1234.5678901) is True
    assert client.left_at("ann", first.conv) == 1234.5678901, "the page's clock, kept to the microsecond"
    assert client.leave("bob", first.conv, 9e9) is False and client.left_at("ann", first.conv) == 1234.5678901
    assert client.left_at("bob", first.conv) is None, "nobody else reads it"
    client.r.delete(client.keys.conversation(first.conv))  # (it expired)
    assert client.leave("ann", first.conv, 2e9) is False
    assert not client.r.exists(client.keys.conversation(first.conv))


def test_one_pending_turn_per_conversation(client):
    job, conv = submit(client, "ann")
    with pytest.raises(ConversationBusy) as exc:
        client.submit_turn("ann", conv, "second")
    assert "cancel" in exc.value.user_message
    assert len(client.history("ann", conv)) == 1


def test_concurrent_dispatchers_pop_each_job_exactly_once(client):
    jobs = {submit(client, f"u{i % 7}", conv=None)[0] for i in range(60)}
    got, lock = [], threading.Lock()

    def worker():
        mine = pop_all(client)
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(jobs)
    assert client.readouts.queued_total() == 0


def test_reader_that_attaches_late_gets_everything(client):
    job, _ = submit(client, "ann")
    client.cancel("ann", job)
    first = list(client.events(job))
    again = list(client.events(job))
    assert first == again and [e["type"] for _, e in first] == ["queued", "cancelled"]
    resumed = list(client.events(job, last_id=first[0][0]))
    assert resumed == first[1:]


def test_reader_resuming_after_the_end_returns_and_a_vanished_stream_still_ends(client):
    job, _ = submit(client, "ann")
    client.cancel("ann", job)
    terminal_id = list(client.events(job))[-1][0]
    t0 = time.monotonic()
    assert list(client.events(job, last_id=terminal_id)) == []
    assert time.monotonic() - t0 < 3
    other, _ = submit(client, "bob")
    client.r.delete(client.keys.stream(other))  # as if it expired while a reader waited
    events = [e for _, e in client.events(other)]
    assert [e["type"] for e in events] == ["error"] and "no longer available" in events[0]["message"]


def test_blocking_read_outlives_the_socket_timeout(client):
    """redis-py 8 times sockets out after 5 s; a reader must keep waiting past that."""
    job, _ = submit(client, "ann")
    timer = threading.Timer(5.5, client.cancel, args=("ann", job))
    timer.start()
    t0 = time.monotonic()
    types = [e["type"] for _, e in client.events(job)]
    timer.join()  # the cancel call may still be reading its reply; let it finish before the client closes
    assert types == ["queued", "cancelled"] and time.monotonic() - t0 > 5.0


def test_raw_enqueue_dispatches_with_dispatch_number(client, fake_capacity):
    d = client.jobs
    job = Job("j1", "ann", "c1", 0, (Message("user", "x"),))
    d.enqueue(job, None)
    fake_capacity(1)
    assert client.dispatch() == 1
    assert client.r.hget(client.keys.job("j1"), JobField.dispatch_n) == b"1"


def test_slots_beyond_the_decode_rows_are_kept_for_groups_with_nothing_in_flight(client):
    """Two decode rows and two more slots: the heavy group fills the rows, and then only groups with nothing in
    flight are dispatched (their answers wait in an engine that time-slices, not behind the heavy answers)."""
    heavy = [submit(client, "heavy", f"q{i}")[0] for i in range(6)]
    order = []
    while (popped := client.jobs.pop(4, 2)):
        order.append(popped[0])
    assert order == heavy[:2], "a served group gets the shared rows only"
    newcomer = submit(client, "visitor")[0]
    second = submit(client, "visitor", "again")[0]
    third = submit(client, "late")[0]
    order = []
    while (popped := client.jobs.pop(4, 2)):
        order.append(popped[0])
    assert order == [newcomer, third], "each newcomer group gets one slot beyond the rows, then no one"
    assert client.jobs.pop(5, 2) is None and client.job_state(second) == "queued"
    assert client.jobs.pop(6, 6)[0] in (heavy[2], second)  # below the rows: round robin as before


def test_a_group_whose_answer_just_ended_queues_behind_a_newcomer_and_lighter_users(client):
    """Sixty addresses re-asking the moment their answers ended each looked like a newcomer (nothing in flight,
    nothing queued), and a visitor waited behind all of them. Now a group that starts waiting goes behind every
    waiting group that has used the workers less lately (seconds in flight, decaying)."""
    heavy, light = submit(client, "heavy")[0], submit(client, "light")[0]
    assert pop_all(client) == [heavy, light]
    time.sleep(0.1)
    assert client.jobs.finish(light, "done")  # light held its slot for 0.1 s
    time.sleep(0.5)
    assert client.jobs.finish(heavy, "done")  # heavy for 0.6 s
    heavy_again = submit(client, "heavy", "again")[0]
    light_again = submit(client, "light", "again")[0]
    visitor = submit(client, "visitor")[0]
    assert [client.queue_position(j) for j in (visitor, light_again, heavy_again)] == [1, 2, 3]
    assert pop_all(client) == [visitor, light_again, heavy_again]


def test_a_groups_usage_is_a_key_of_its_own_that_expires_when_its_use_no_longer_counts(client):
    """A public link is served by a crowd of addresses that each ask a few questions and leave. Their usage once lived
    in one hash whose expiry every answer pushed out, so on a service that never went quiet it kept a field for every
    address it ever served. Each group's usage is now a key that expires 20 half-lives after its last charge, when
    what it holds counts for under a millionth: what the crowd of recent addresses holds is bounded by that time."""
    from worker.queue.fairness import GROUP_USAGE_HALF_LIFE_S

    jobs = [client.submit(f"visitor{i}", None, "hi", group=f"addr{i}").job for i in range(40)]
    assert sorted(pop_all(client)) == sorted(jobs)
    for job in jobs:
        assert client.jobs.finish(job, "done")
    for i in range(40):
        key = client.keys.group_usage(f"addr{i}")
        seconds, _, at = client.r.get(key).decode().partition(":")
        assert float(seconds) >= 0 and abs(float(at) - time.time()) < 60, "charged its time in flight, in Redis time"
        assert 20 * GROUP_USAGE_HALF_LIFE_S - 60 < client.r.ttl(key) <= 20 * GROUP_USAGE_HALF_LIFE_S
    assert not client.r.exists(client.keys.legacy_group_usage), "no service-wide ledger of every address"


def test_usage_sets_a_waiting_group_back_by_at_most_the_cap_and_a_served_group_goes_behind(client):
    """A group waits with the key 'started waiting + usage (capped)': lighter groups that start waiting later go
    ahead of it only while their key is smaller, so once it has waited out its usage it keeps its place."""
    from worker.queue.fairness import GROUP_USAGE_CAP_S, GROUP_USAGE_WEIGHT

    now = client.r.time()
    now = now[0] + now[1] / 1e6
    client.r.set(client.keys.group_usage("heavy"), f"{10 * GROUP_USAGE_CAP_S}:{now}")
    heavy = submit(client, "heavy")[0]
    key = waiting_key(client, "heavy")
    assert GROUP_USAGE_CAP_S - 1 < key - now <= GROUP_USAGE_CAP_S + 1, "usage counts at most the cap"
    client.r.set(client.keys.group_usage("mid"), f"2:{now}")
    mid = submit(client, "mid")[0]
    mid_key = waiting_key(client, "mid")
    assert 2 * GROUP_USAGE_WEIGHT - 1 < mid_key - now < 2 * GROUP_USAGE_WEIGHT + 1, "weighted below the cap"
    assert client.queue_position(mid) == 1
    client.cancel("mid", mid)
    visitor = submit(client, "visitor")[0]
    assert client.queue_position(visitor) == 1, "a newcomer goes ahead while heavy's usage still counts"
    # as if heavy's setback had run out just after the visitor came: later arrivals now queue behind it
    set_waiting_key(client, "heavy", waiting_key(client, "visitor") + 0.001)
    time.sleep(0.01)  # late arrives after that key (a fast host reaches its submit within the millisecond)
    late = submit(client, "late")[0]
    assert [client.queue_position(j) for j in (visitor, heavy, late)] == [1, 2, 3]
    # a group with a job in flight is served: its next job waits behind every waiting group, whatever its usage
    assert pop_all(client, capacity=1) == [visitor]
    again = submit(client, "visitor", "again")[0]
    assert client.queue_position(again) == 3
    assert pop_all(client) == [heavy, late, again]
    assert client.r.zcard(client.keys.line) == 0, "nothing is left in line once every job is served"
    assert all(waiting_key(client, g) is None for g in ("heavy", "late", "visitor")), \
        "keys are dropped when groups are served"


def _redis_now(client) -> float:
    now = client.r.time()
    return now[0] + now[1] / 1e6


def test_a_line_longer_than_the_cap_sets_a_heavy_group_back_to_its_end_and_no_further(client):
    """When groups have waited longer than the cap, a group that used the workers a lot is set back by up to the
    longest wait now (not just the cap), so a newcomer still goes ahead of it; never further than that wait."""
    from worker.queue.fairness import GROUP_USAGE_CAP_S

    crowd = submit(client, "crowd")[0]
    now = _redis_now(client)
    client.r.zadd(client.keys.waiting_since, {"crowd": now - 3 * GROUP_USAGE_CAP_S})  # as if it had waited 90 s
    client.r.set(client.keys.group_usage("heavy"), f"{1000 * GROUP_USAGE_CAP_S}:{now}")
    heavy = submit(client, "heavy")[0]
    setback = waiting_key(client, "heavy") - now
    assert 3 * GROUP_USAGE_CAP_S - 1 < setback < 3 * GROUP_USAGE_CAP_S + 1, "set back by the longest wait now"
    client.r.set(client.keys.group_usage("moderate"), f"{GROUP_USAGE_CAP_S / 2}:{now}")
    moderate = submit(client, "moderate")[0]
    setback = waiting_key(client, "moderate") - now
    assert GROUP_USAGE_CAP_S < setback < 3 * GROUP_USAGE_CAP_S - 1, "beyond the cap, by its own weighted usage"
    visitor = submit(client, "visitor")[0]
    assert pop_all(client) == [crowd, visitor, moderate, heavy]
    assert client.r.zcard(client.keys.waiting_since) == 0, "wait starts are dropped when groups are served"


def test_the_last_slots_go_to_light_groups_and_their_position_says_so(client):
    """Six slots, two decode rows: rows 1-2 round robin, slots 3-4 for groups with nothing in flight, slots 5-6
    only for such groups that used the workers little lately. A crowd of heavy groups with nothing in flight
    cannot take the last slots, and a visitor queued behind the crowd is told it is first."""
    from worker.queue.fairness import GROUP_USAGE_CAP_S

    now = _redis_now(client)
    crowd = []
    for i in range(6):
        client.r.set(client.keys.group_usage(f"crowd{i}"), f"{GROUP_USAGE_CAP_S}:{now}")  # weighted 4x: heavy
        crowd.append(submit(client, f"crowd{i}")[0])
    order = []
    while (popped := client.jobs.pop(6, 2)):
        order.append(popped[0])
    assert order == crowd[:4], "rows and newcomer slots, but not the light groups' slots"
    for i in (4, 5):  # as if they had waited out their setback: ahead of anyone arriving now
        set_waiting_key(client, f"crowd{i}", now - 100 + i)
    visitor = submit(client, "visitor")[0]
    assert [client.queue_position(j) for j in (crowd[4], crowd[5])] == [1, 2]
    assert client.queue_position(visitor) == 1, "it takes the next light slot, whatever the crowd ahead of it"
    assert client.jobs.pop(6, 2)[0] == visitor
    assert client.jobs.pop(6, 2) is None, "the last light slot stays free for the next light group"
    assert [client.queue_position(j) for j in (crowd[4], crowd[5])] == [1, 2]


def test_the_light_slots_go_to_the_group_that_used_the_workers_least(client):
    """Crowd addresses whose usage decayed below the light bound while they waited are light too; a visitor who has
    used nothing still takes the next light slot before them, and is told so."""
    from worker.queue.fairness import GROUP_USAGE_CAP_S, GROUP_USAGE_WEIGHT

    now = _redis_now(client)
    heavy = [submit(client, f"heavy{i}")[0] for i in range(4)]
    assert [popped[0] for popped in iter(lambda: client.jobs.pop(6, 2), None)] == heavy, "rows and newcomer slots"
    light_usage = GROUP_USAGE_CAP_S / GROUP_USAGE_WEIGHT / 2  # within the light bound, but not nothing
    crowd = []
    for i in range(3):
        client.r.set(client.keys.group_usage(f"crowd{i}"), f"{light_usage * (1 + i / 10)}:{now}")
        crowd.append(submit(client, f"crowd{i}")[0])
        set_waiting_key(client, f"crowd{i}", now - 100 + i)  # waited out their setback
    visitor = submit(client, "visitor")[0]
    assert [client.queue_position(j) for j in (*crowd, visitor)] == [1, 2, 3, 1], \
        "the crowd's walk order, and the visitor first among light groups"
    assert client.jobs.pop(6, 2)[0] == visitor, "the light slot goes to the least used"
    assert [popped[0] for popped in iter(lambda: client.jobs.pop(6, 2), None)] == crowd[:1], \
        "the last light slot: the least used of the crowd"


def test_without_slots_beyond_the_rows_a_position_is_the_round_robin_order(client):
    """A worker without time slicing holds only its rows: nobody can skip the line, and positions say so."""
    from worker.queue.fairness import GROUP_USAGE_CAP_S

    now = _redis_now(client)
    client.r.set(client.keys.group_usage("crowd"), f"{GROUP_USAGE_CAP_S}:{now}")
    crowd = submit(client, "crowd")[0]
    set_waiting_key(client, "crowd", now - 100)  # it has waited out its setback
    client.r.hset(client.keys.slots, mapping={SlotsField.capacity: 1, SlotsField.shared: 1,
                                              SlotsField.light_from: 1})  # as a last POP left it
    visitor = submit(client, "visitor")[0]
    assert [client.queue_position(j) for j in (crowd, visitor)] == [1, 2]
    assert pop_all(client) == [crowd, visitor]
