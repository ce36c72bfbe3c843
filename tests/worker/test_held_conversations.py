"""A worker started on a disk-cache folder claims the conversations it holds there, unless another live worker holds
them (real Redis)."""
from __future__ import annotations

from worker import held_conversations
from worker.heartbeat import Heartbeat, publish
from worker.store.keys import Keys


def test_claims_what_no_other_live_worker_holds(r, settings, client):
    keys = Keys(settings.key_prefix)
    convs = {name: client.new_conversation("ann") for name in ("unheld", "dead", "mine", "live", "gone")}
    publish(r, keys, Heartbeat(worker="other@host", capacity=1), ttl_s=60)
    r.set(keys.holder(convs["dead"]), "crashed@host")
    r.set(keys.holder(convs["mine"]), "me@host")
    r.set(keys.holder(convs["live"]), "other@host")
    r.delete(keys.conversation(convs["gone"]))  # expired or deleted since: nothing to route
    claimed = held_conversations.claim(r, keys, "me@host", list(convs.values()), ttl_s=100)
    assert claimed == 3
    holders = {name: r.get(keys.holder(conv)) for name, conv in convs.items()}
    assert holders == {"unheld": b"me@host", "dead": b"me@host", "mine": b"me@host", "live": b"other@host",
                       "gone": None}
    assert 0 < r.ttl(keys.holder(convs["unheld"])) <= 100
