"""The Redis data model, declared once: every key Owlet uses (under one prefix), and the fields of its hashes.

``Keys`` names every key; each key's docstring says what it holds and who writes it. A hash with a fixed set of
fields has a class of field names below (``JobField``, ``ConvField``, ``SlotsField``, ``StatField``), a line per
field saying what it holds and who writes it; a hash keyed by group, identity or image says so in its key's
docstring. ``JobState`` names a job's states, ``EntryField`` the fields of a stream entry.

Python reads and writes through these names. The Lua scripts (``worker/queue/lua``) get the same names from here:
the script loader (``worker.queue.scripts``) writes them ahead of every script as Lua tables, ``KEY`` (from
``Keys.for_scripts``), ``JOB``, ``CONV``, ``SLOTS``, ``STATE`` and ``ENTRY`` (and ``TURNS_SUFFIX``), so a name is
spelled in this module only, and tests/worker/test_data_model.py checks that the scripts use no name it does not
declare.

The key names and field names are what a running deployment has stored: renaming one here orphans what Redis
holds under the old name.
"""
from __future__ import annotations

from dataclasses import dataclass

TURNS_SUFFIX = ":turns"
TOTAL_IMAGES = "*all*"  # the owner of the service-wide image quota (identities' quotas are "u:…", groups' "g:…")


@dataclass(frozen=True)
class Keys:
    prefix: str

    # -- conversations, images and jobs ----------------------------------------------------------------------
    def image(self, sha: str) -> str:
        """String: the bytes of one stored image, by their sha256, with a TTL. SUBMIT (and ``ImageStore.put``)."""
        return f"{self.prefix}img:{sha}"

    def conversation(self, conv: str) -> str:
        """Hash of ``ConvField``: who owns the conversation and which job answers it now."""
        return f"{self.prefix}conv:{conv}"

    def turns(self, conv: str) -> str:
        """List of JSON turns {role, text, image_sha, job_id}: SUBMIT appends questions, FINISH answers."""
        return f"{self.conversation(conv)}{TURNS_SUFFIX}"

    def newest_conversation(self, user: str) -> str:
        """String: the id of the newest conversation this identity started (see OwletClient.first_answer). SUBMIT
        writes it; a conversation that gives way to the history budget takes it along while it names it."""
        return f"{self.prefix}newest:{user}"

    def chat_index(self, user: str, digest: str) -> str:
        """String with the history's TTL: the conversation a stateless request (the API) was stored in, under the
        sha256 of the messages it sent, its question included (``worker.store.conversation_index``). The next request
        sends them again with the answer, and continues that conversation. SUBMIT writes it with the turn."""
        return f"{self.prefix}chatidx:{user}:{digest}"

    def chat_indexes_of(self, conv: str) -> str:
        """Set of the ``chat_index`` keys naming this conversation, so that it gives way with them: SUBMIT."""
        return f"{self.prefix}chatidx_of:{conv}"

    def cleared(self, conv: str) -> str:
        """String: the identity that owned a conversation which gave way to the history budget, kept for the
        history's TTL so that its owner is told why it is gone (``worker.errors.ConversationCleared``)."""
        return f"{self.prefix}cleared:{conv}"

    def job(self, job_id: str) -> str:
        """Hash of ``JobField``: one job, from SUBMIT until ``stream_ttl_s`` after it ended."""
        return f"{self.prefix}job:{job_id}"

    def stream(self, job_id: str) -> str:
        """Stream of the job's events (entries of ``EntryField``): the scripts write the queued, started and
        terminal events, the runner the tokens (``worker.store.streams``)."""
        return f"{self.prefix}stream:{job_id}"

    def started_notices(self, page: str) -> str:
        """Stream of the jobs a page submitted that started (entry data: the job id), so the page reads a waiting
        answer's stream again the moment it starts. A page's stream reader names it in SUBMIT (``JobField.notify``),
        start_job writes it, and the page refreshes its TTL while it runs."""
        return f"{self.prefix}started:{page}"

    def cancel(self, job_id: str) -> str:
        """String flag: the job's user stopped it while it ran (``JobStates.cancel``); its worker relays it."""
        return f"{self.prefix}cancel:{job_id}"

    # -- the fair queue (docs/design.md "Fair dispatch"; worker/queue/lua/line.lua) ------------------------------
    def user_queue(self, user: str) -> str:
        """List of one identity's waiting job ids, oldest first."""
        return f"{self.prefix}uq:{user}"

    def group_queue(self, group: str) -> str:
        """List of the identities of one client group (an address, or a login) with waiting jobs, round robin."""
        return f"{self.prefix}gq:{group}"

    @property
    def line(self) -> str:
        """Zset of every queued job in the order POP serves them: score = the turns of the ring ahead of it, member =
        its group's place (``places``) followed by the job id. SUBMIT, POP, REQUEUE and FINISH keep it."""
        return f"{self.prefix}line"

    @property
    def fifo_line(self) -> str:
        """Zset of the queued jobs of FIFO mode's one shared group (``Settings.fifo``), each scored by its tag in
        ``line`` (its arrival; a job put back, the negative): what that group keeps instead of ``user_queue`` and
        ``group_queue``, so that a cancel removes one of thousands in O(log N), not by scanning a list."""
        return f"{self.prefix}fifo_line"

    @property
    def places(self) -> str:
        """Hash group -> its place in the ring (a fixed-width string: tier, key, arrival sequence), while it has queued
        jobs."""
        return f"{self.prefix}places"

    @property
    def line_seq(self) -> str:
        """Integer: the arrival sequence that breaks ties between places."""
        return f"{self.prefix}line_seq"

    @property
    def idle_line(self) -> str:
        """Zset (all scores 0) of the groups in line with nothing in flight, as "<place><group>": the order POP
        serves the slots beyond the decode rows."""
        return f"{self.prefix}idle_line"

    @property
    def light_line(self) -> str:
        """Zset of the same groups as ``idle_line`` (same members), scored by their usage (``usage_key`` in
        usage.lua): the order POP serves the last slots, which go only to groups that used the workers little."""
        return f"{self.prefix}light_line"

    @property
    def legacy_idle_members(self) -> str:
        """Earlier versions' hash group -> its member in ``idle_line`` and ``light_line``, which is its place followed
        by the group (line.lua reads it off the place): ADOPT_LINE deletes it."""
        return f"{self.prefix}idle_members"

    @property
    def legacy_ring(self) -> str:
        """List of client groups waiting in the line's earlier form (walked from the front, no sorted set): ADOPT_LINE
        puts them in the line once, when a worker starts, and deletes it."""
        return f"{self.prefix}ring"

    @property
    def legacy_ring_keys(self) -> str:
        """Hash group -> key of the line's earlier form: deleted with ``legacy_ring``."""
        return f"{self.prefix}ring_keys"

    @property
    def legacy_served(self) -> str:
        """Set of the groups served in this busy period, as earlier versions kept them (a group is served in it exactly
        while it has a job in flight when it starts waiting, so the line reads that instead): ADOPT_LINE deletes it."""
        return f"{self.prefix}served"

    @property
    def legacy_queued_count(self) -> str:
        """Integer: queued jobs in total, as earlier versions counted them beside the line (the line holds each queued
        job once: its size is the count the global cap reads): ADOPT_LINE deletes it."""
        return f"{self.prefix}queued"

    @property
    def queued_by_user(self) -> str:
        """Hash identity -> queued jobs (the per-identity cap), in FIFO mode only: in the fair line an identity's own
        queue (``user_queue``) holds its queued jobs, and its length is the count."""
        return f"{self.prefix}queued_by_user"

    @property
    def queued_by_group(self) -> str:
        """Hash group -> queued jobs (with ``inflight_by_group``: the per-address cap)."""
        return f"{self.prefix}queued_by_group"

    @property
    def inflight_by_group(self) -> str:
        """Hash group -> dispatched or running jobs."""
        return f"{self.prefix}inflight_by_group"

    def group_usage(self, group: str) -> str:
        """String "seconds:t": client group ``group``'s jobs' time in flight as of Redis time t, decaying by half every
        ``GROUP_USAGE_HALF_LIFE_S``. FINISH charges a job's time in flight to it and sets it to expire 20 half-lives
        later (by then the usage counts for nothing); SUBMIT and POP read it. One key a group, so what the crowd of
        addresses that used the workers lately holds is bounded by that time, however busy the service stays."""
        return f"{self.prefix}usage:{group}"

    @property
    def legacy_group_usage(self) -> str:
        """Earlier versions' hash of every group's usage, which kept a field for each group ever served while the
        service stayed busy: ADOPT_LINE deletes it (the usage it held decays within minutes anyway)."""
        return f"{self.prefix}group_usage"

    @property
    def waiting_since(self) -> str:
        """Zset group -> when it started waiting (Redis time), for the groups waiting with a key (not yet served):
        the longest wait bounds a heavy group's setback."""
        return f"{self.prefix}waiting_since"

    @property
    def slots(self) -> str:
        """Hash of ``SlotsField``: how the last dispatch pass split the workers' slots, and the mean run time of a job
        that ETAs rest on. POP writes the split and FINISH the mean; POSITION and queued events read both."""
        return f"{self.prefix}slots"

    @property
    def queued_since(self) -> str:
        """Zset job -> enqueue time, for queue timeouts."""
        return f"{self.prefix}queued_since"

    @property
    def inflight(self) -> str:
        """Zset job -> dispatch time: jobs handed to Celery and not finished."""
        return f"{self.prefix}inflight"

    @property
    def unclaimed(self) -> str:
        """Zset job -> dispatch time: dispatched jobs no worker has started yet (what Celery still carries)."""
        return f"{self.prefix}unclaimed"

    @property
    def celery_queue(self) -> str:
        """The Celery queue every worker consumes (each also has its own direct queue, for affinity)."""
        return f"{self.prefix}jobs"

    # -- workers ---------------------------------------------------------------------------------------------
    @property
    def workers(self) -> str:
        """Set of every worker name ever seen; the reaper checks their heartbeats."""
        return f"{self.prefix}workers"

    def heartbeat(self, worker: str) -> str:
        """String: the worker's ``worker.heartbeat.Heartbeat`` as JSON (capacity, load), with a TTL; the worker
        writes it every ``heartbeat_interval_s``, and a worker whose heartbeat expired is presumed dead."""
        return f"{self.prefix}hb:{worker}"

    def running(self, worker: str) -> str:
        """Set of job ids started on ``worker``: CLAIM adds, FINISH and REQUEUE remove."""
        return f"{self.prefix}running:{worker}"

    def cancels(self, worker: str) -> str:
        """Set of the jobs started on ``worker`` whose users stopped them (``JobStates.cancel``), until they end
        (FINISH, REQUEUE): the worker reads it once a poll for all its jobs, instead of each job's flag."""
        return f"{self.prefix}cancels:{worker}"

    def holder(self, conv: str) -> str:
        """Name of the worker that ran the conversation's last turn (holds its KV cache); FINISH writes it."""
        return f"{self.prefix}holder:{conv}"

    # -- quotas and limits (SUBMIT checks and charges them) --------------------------------------------------
    def _image_quota(self, owner: str) -> str:
        return f"{self.prefix}quota:{owner}"

    def user_image_quota(self, user: str) -> str:
        """Integer: bytes of images one identity sent in the current image-quota window."""
        return self._image_quota(f"u:{user}")

    def group_image_quota(self, group: str) -> str:
        """Integer: bytes of images one client group sent in the current image-quota window."""
        return self._image_quota(f"g:{group}")

    @property
    def total_image_quota(self) -> str:
        """Integer: bytes of the images the whole service holds now (``images_held`` says when each goes)."""
        return self._image_quota(TOTAL_IMAGES)

    def images_held(self) -> str:
        """Zset of the stored images' keys -> when each expires, so the service total counts what is held now."""
        return f"{self.prefix}images_held"

    def image_sizes(self) -> str:
        """Hash of the stored images' keys -> bytes (what the total gives back when one expires)."""
        return f"{self.prefix}image_sizes"

    def image_holders(self) -> str:
        """Zset of client groups -> bytes of the stored images each was first to send (who gives way first)."""
        return f"{self.prefix}image_holders"

    def image_owners(self) -> str:
        """Hash of the stored images' keys -> the client group that sent each first."""
        return f"{self.prefix}image_owners"

    def images_of(self, group: str) -> str:
        """Zset of the stored images one client group sent first -> when each expires (its own LRU order)."""
        return f"{self.prefix}images_of:{group}"

    def picture_jobs(self, image_key: str) -> str:
        """Set of the live jobs admitted with the stored image ``image_key`` (a full ``image()`` key): while one of
        them is live, the image does not give way to new ones. SUBMIT adds a job, FINISH takes it out (so the set is
        as large as the image's live jobs, however often it was asked about)."""
        return f"{self.prefix}picture_jobs:{image_key}"

    # -- the service-wide history budget (docs/redis_memory.md): SUBMIT charges it, FINISH corrects it ----------
    @property
    def history_total(self) -> str:
        """Integer: the bytes the held conversations (and the notices of cleared ones) are charged, in all."""
        return f"{self.prefix}history_total"

    @property
    def conversations_held(self) -> str:
        """Zset conversation -> when it expires (Redis time): its TTL runs from its last turn, so this is also
        least-recently-used order. The budget's oldest give way first."""
        return f"{self.prefix}convs_held"

    @property
    def conversation_sizes(self) -> str:
        """Hash conversation -> the bytes it is charged (``worker.store.memory_model``)."""
        return f"{self.prefix}conv_sizes"

    @property
    def cleared_held(self) -> str:
        """Zset conversation -> when its ``cleared`` notice expires: the notices, oldest first."""
        return f"{self.prefix}cleared_held"

    def _text_quota(self, owner: str) -> str:
        return f"{self.prefix}textquota:{owner}"

    def user_text_quota(self, user: str) -> str:
        """Integer: bytes of text (turns and job payloads) stored for one identity in the current text-quota
        window."""
        return self._text_quota(f"u:{user}")

    def group_text_quota(self, group: str) -> str:
        """Integer: bytes of text stored for one client group in the current text-quota window."""
        return self._text_quota(f"g:{group}")

    def submit_rate(self, group: str) -> str:
        """Integer: turns admitted for one group in the current rate-limit window."""
        return f"{self.prefix}rate:{group}"

    # -- the service -----------------------------------------------------------------------------------------
    @property
    def identity_key(self) -> str:
        """The server-only key that signs anonymous identities when none is configured (never sent out)."""
        return f"{self.prefix}ui:identity_key"

    @property
    def sweep_lock(self) -> str:
        """String with a short TTL: a reaper sweep ran just now (many waiting readers cost one sweep)."""
        return f"{self.prefix}sweep_lock"

    @property
    def stats(self) -> str:
        """Hash of ``StatField`` counters."""
        return f"{self.prefix}stats"

    @property
    def legacy_service_time(self) -> str:
        """Earlier versions' moving average of one job's run time (``SlotsField.service_s`` keeps it now, read with
        the slot layout): ADOPT_LINE deletes it."""
        return f"{self.prefix}service_s"

    # -- for Lua scripts -------------------------------------------------------------------------------------
    def for_scripts(self) -> dict[str, str]:
        """The scripts' ``KEY`` table: the fixed keys, and the prefixes of the keys a script puts together itself
        (a job's, the next identity's queue, a quota of the job's user) by appending an id. A conversation's turns
        are ``KEY.conv .. conv .. TURNS_SUFFIX``. The scripts' text holds these names for the prefix ""; a script
        puts this prefix in front of each when it starts (``worker.queue.scripts``)."""
        return {
            # fixed keys
            "line": self.line, "fifo_line": self.fifo_line, "places": self.places, "line_seq": self.line_seq,
            "idle_line": self.idle_line, "light_line": self.light_line, "legacy_idle_members": self.legacy_idle_members,
            "unclaimed": self.unclaimed,
            "legacy_ring": self.legacy_ring, "legacy_ring_keys": self.legacy_ring_keys,
            "legacy_served": self.legacy_served, "legacy_queued_count": self.legacy_queued_count,
            "queued_by_user": self.queued_by_user, "queued_by_group": self.queued_by_group,
            "inflight_by_group": self.inflight_by_group, "queued_since": self.queued_since,
            "inflight": self.inflight, "legacy_group_usage": self.legacy_group_usage,
            "waiting_since": self.waiting_since, "slots": self.slots, "total_image_quota": self.total_image_quota,
            "images_held": self.images_held(), "image_sizes": self.image_sizes(), "legacy_service_time": self.legacy_service_time,
            "image_holders": self.image_holders(), "image_owners": self.image_owners(),
            "history_total": self.history_total, "conversations_held": self.conversations_held,
            "conversation_sizes": self.conversation_sizes, "cleared_held": self.cleared_held,
            # prefixes (and the turns suffix)
            "user_queue": self.user_queue(""), "group_queue": self.group_queue(""), "job": self.job(""),
            "stream": self.stream(""), "cancel": self.cancel(""), "conv": self.conversation(""),
            "running": self.running(""), "cancels": self.cancels(""), "holder": self.holder(""),
            "image": self.image(""), "picture_jobs": self.picture_jobs(""), "images_of": self.images_of(""),
            "user_image_quota": self.user_image_quota(""), "group_image_quota": self.group_image_quota(""),
            "user_text_quota": self.user_text_quota(""), "group_text_quota": self.group_text_quota(""),
            "submit_rate": self.submit_rate(""), "newest": self.newest_conversation(""),
            "group_usage": self.group_usage(""),
            # a chat_index key is this prefix, then "<user>:<digest>"
            "chat_index": self.chat_index("", "")[:-1], "chat_indexes_of": self.chat_indexes_of(""),
            "cleared": self.cleared(""),
        }


def fields_of(declaration: type) -> dict[str, str]:
    """The names a declaration class below holds, by attribute: ``{"state": "state", ...}`` for ``JobField``."""
    return {name: value for name, value in vars(declaration).items()
            if not name.startswith("_") and isinstance(value, str)}


class JobState:
    """The states of a job (``JobField.state``; the transitions are ``worker.queue.job_states``). Its stream gets an
    event named after each state it enters (queued, started, and the one it ends in), besides its tokens."""
    queued = "queued"  # admitted, waiting in its identity's queue: SUBMIT, REQUEUE
    dispatched = "dispatched"  # handed to Celery, no worker has claimed it yet: POP
    started = "started"  # claimed by a worker, which is answering: CLAIM
    done = "done"  # answered: FINISH
    error = "error"  # ended with an error the user is told: FINISH (and REQUEUE past max_attempts)
    cancelled = "cancelled"  # stopped by its user: FINISH (and REQUEUE when its worker was lost meanwhile)


LIVE_STATES = (JobState.queued, JobState.dispatched, JobState.started)
ENDED_STATES = (JobState.done, JobState.error, JobState.cancelled)


class JobField:
    """The fields of a job's hash (``Keys.job``): what it asks, whose it is, where it waits, and its state."""
    payload = "payload"  # the job as JSON (worker.store.jobs.Job), what the worker runs: SUBMIT
    user = "user"  # the identity that asked: SUBMIT
    group = "group"  # its client group (an address, or a login): what caps, usage and cache shares count: SUBMIT
    qkey = "qkey"  # the identity whose queue it waits in (the user; in FIFO mode one shared queue): SUBMIT
    qgroup = "qgroup"  # the ring entry serving that queue (the group; in FIFO mode the shared one): SUBMIT
    conv = "conv"  # the conversation it answers: SUBMIT
    turn = "turn"  # index of its question in the conversation's turns (absent for a job without one): SUBMIT
    state = "state"  # a JobState: every script
    enqueued_at = "enqueued_at"  # the caller's clock when it was admitted, for inspection: SUBMIT
    attempts = "attempts"  # dispatches so far; REQUEUE fails it after max_attempts: SUBMIT (0), POP
    dispatch_n = "dispatch_n"  # number of its latest dispatch; a Celery message with another is stale: SUBMIT, POP
    dispatched_at = "dispatched_at"  # the caller's clock at its latest dispatch, for inspection: POP
    flight_t = "flight_t"  # Redis time at its latest dispatch: FINISH charges its group's usage from it: POP
    target = "target"  # the worker its latest dispatch went to ("" = the shared queue): POP, FairDispatch, REQUEUE
    worker = "worker"  # the worker that claimed it ("" once requeued): CLAIM, REQUEUE
    started_at = "started_at"  # the worker's clock when it claimed it (the reaper's run deadline): CLAIM
    reserved = "reserved"  # history-budget bytes charged for its answer before it exists: SUBMIT (FINISH corrects)
    notify = "notify"  # the stream (``Keys.started_notices``) its start is announced on ("" = none): SUBMIT
    picture = "picture"  # the sha256 of the stored image it was admitted with, absent for none: SUBMIT (its job is in
    # that image's ``Keys.picture_jobs`` until it ends: FINISH takes it out)


class ConvField:
    """The fields of a conversation's hash (``Keys.conversation``); its turns are a list of their own."""
    user = "user"  # the identity that owns it: SUBMIT of its first turn (or ConversationStore.create)
    created = "created"  # the caller's clock when it was created: with ``user``
    pending = "pending"  # the job answering its last question, until that job ends: SUBMIT sets, FINISH clears
    chars = "chars"  # characters of its turns' texts (the history_max_chars limit): SUBMIT, FINISH, TRUNCATE
    images = "images"  # its turns that name a picture (max_images_per_request): SUBMIT, TRUNCATE
    left = "left"  # when its owner left it with "New conversation", by the page's clock: LEAVE (a reload reopens a
    # chat the browser kept only if the browser kept it after this)


class SlotsField:
    """The fields of ``Keys.slots``: how the last dispatch pass (POP) split the workers' slots, which POSITION
    reads to say where a job stands among the groups competing for the slots kept for them."""
    capacity = "capacity"  # jobs the live workers take at once
    shared = "shared"  # of those, the slots served round robin (the workers' decode rows)
    light_from = "light_from"  # jobs in flight past which a slot goes only to a light group with nothing in flight
    service_s = "service_s"  # moving average of one job's run time in seconds (FINISH folds each in): queue ETAs


class StatField:
    """The counters in ``Keys.stats`` (``QueueReadouts.affinity_stats`` reads them)."""
    affinity_hits = "affinity_hits"  # follow-up turns sent to the worker holding their cache: FairDispatch
    affinity_misses = "affinity_misses"  # follow-up turns whose holder was gone or full: FairDispatch
    prefix_route_hits = "prefix_route_hits"  # first questions sent to a worker holding their prefix: FairDispatch
    redispatched = "redispatched"  # jobs requeued after their worker was lost: Reaper
    reaped = "reaped"  # jobs the reaper requeued, failed or timed out: Reaper


class EntryField:
    """The fields of an entry in a job's stream (``Keys.stream``; ``worker.store.streams`` encodes and decodes them)."""
    type = "type"  # the event: a JobState the job entered, or TOKEN_EVENT
    data = "data"  # the event's JSON object (its text, position, message, ...)


TOKEN_EVENT = "token"  # a stream event with answer text (``text``), between ``started`` and the terminal event
