"""What a Celery message costs the broker: Owlet acks on receipt and re-dispatches a job no worker claimed itself
(``worker.queue.reaper``), so kombu keeps no record of the messages it delivered (its ack emulation: an unacked hash
and index written as a message is taken and deleted at its ack, two round trips a message, restored an hour later as
a duplicate the worker's CLAIM drops)."""
from __future__ import annotations

from tests.redis_server import unique_prefix
from worker.celery_app import create_app
from worker.config import Settings


def test_a_delivered_message_leaves_no_record_in_the_broker(redis_url):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("broker"))
    app = create_app(settings)
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(settings.key_prefix + "probe")
        try:
            queue.put({"job": "j1"})
            message = queue.get(timeout=5)
            assert message.payload == {"job": "j1"}
            held = [k.decode() for k in conn.default_channel.client.scan_iter(match=settings.key_prefix + "celery:*")]
            assert not [k for k in held if "unacked" in k], f"kombu recorded the delivered message: {held}"
            message.ack()
        finally:
            queue.close()
            client = conn.default_channel.client
            for key in client.scan_iter(match=settings.key_prefix + "*"):
                client.delete(key)
