"""Every Redis key Owlet uses, in one place, under one prefix.

Lua scripts get their keys from here too: fixed keys through ``KEYS`` (``Keys.script_keys``), and the
prefixes of per-job, per-user and per-conversation keys that only a script can know (the next user in the
ring, a job's conversation) through ``Keys.script_names``, so no script spells a key name itself.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

TURNS_SUFFIX = ":turns"


@dataclass(frozen=True)
class Keys:
    prefix: str

    def image(self, sha: str) -> str:
        return f"{self.prefix}img:{sha}"

    def conversation(self, conv: str) -> str:
        """Hash: user, created, pending (job id of the unanswered turn)."""
        return f"{self.prefix}conv:{conv}"

    def turns(self, conv: str) -> str:
        """List of JSON turns {role, text, image_sha}."""
        return f"{self.conversation(conv)}{TURNS_SUFFIX}"

    def newest_conversation(self, user: str) -> str:
        """String: the id of the newest conversation this identity started (see OwletClient.first_answer)."""
        return f"{self.prefix}newest:{user}"

    def job(self, job_id: str) -> str:
        """Hash: payload (JSON) and state fields."""
        return f"{self.prefix}job:{job_id}"

    def stream(self, job_id: str) -> str:
        return f"{self.prefix}stream:{job_id}"

    def cancel(self, job_id: str) -> str:
        return f"{self.prefix}cancel:{job_id}"

    def user_queue(self, user: str) -> str:
        """List of one identity's waiting job ids."""
        return f"{self.prefix}uq:{user}"

    def group_queue(self, group: str) -> str:
        """List of the identities of one client group (an address, or a login) with waiting jobs, round robin."""
        return f"{self.prefix}gq:{group}"

    @property
    def ring(self) -> str:
        """List of client groups with waiting jobs, in round-robin order."""
        return f"{self.prefix}ring"

    @property
    def served(self) -> str:
        """Set of groups with jobs in flight (or served this round): a group that starts waiting goes first."""
        return f"{self.prefix}served"

    @property
    def queued_count(self) -> str:
        return f"{self.prefix}queued"

    @property
    def queued_by_user(self) -> str:
        """Hash identity -> queued jobs (the per-identity cap)."""
        return f"{self.prefix}queued_by_user"

    @property
    def queued_by_group(self) -> str:
        """Hash group -> queued jobs (with ``inflight_by_group``: the per-address cap)."""
        return f"{self.prefix}queued_by_group"

    @property
    def inflight_by_group(self) -> str:
        """Hash group -> dispatched or running jobs."""
        return f"{self.prefix}inflight_by_group"

    @property
    def group_usage(self) -> str:
        """Hash group -> "seconds:t": its jobs' time in flight, decaying by half every GROUP_USAGE_HALF_LIFE_S."""
        return f"{self.prefix}group_usage"

    @property
    def ring_keys(self) -> str:
        """Hash group -> the key it waits in the ring with: when it started waiting plus its capped usage."""
        return f"{self.prefix}ring_keys"

    @property
    def queued_since(self) -> str:
        """Zset job -> enqueue time, for queue timeouts."""
        return f"{self.prefix}queued_since"

    @property
    def inflight(self) -> str:
        """Zset job -> dispatch time: jobs handed to Celery and not finished."""
        return f"{self.prefix}inflight"

    @property
    def workers(self) -> str:
        """Set of every worker name ever seen; the reaper checks their heartbeats."""
        return f"{self.prefix}workers"

    def heartbeat(self, worker: str) -> str:
        return f"{self.prefix}hb:{worker}"

    def running(self, worker: str) -> str:
        """Set of job ids started on ``worker``."""
        return f"{self.prefix}running:{worker}"

    def holder(self, conv: str) -> str:
        """Name of the worker that ran the conversation's last turn (holds its KV cache)."""
        return f"{self.prefix}holder:{conv}"

    def image_quota(self, owner: str) -> str:
        """Bytes of images stored for one identity (``u:<id>``) or one group (``g:<group>``) in the quota window."""
        return f"{self.prefix}quota:{owner}"

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
        """Set of the jobs admitted with the stored image ``image_key`` (a full ``image()`` key): while one of them
        is live, the image does not give way to new ones."""
        return f"{self.prefix}picture_jobs:{image_key}"

    def text_quota(self, owner: str) -> str:
        """Bytes of text (turns and job payloads) stored for one identity (``u:<id>``) or group (``g:<group>``)
        in the current text-quota window."""
        return f"{self.prefix}textquota:{owner}"

    def submit_rate(self, group: str) -> str:
        """Turns admitted for one group in the current rate-limit window."""
        return f"{self.prefix}rate:{group}"

    @property
    def identity_key(self) -> str:
        """The server-only key that signs anonymous identities when none is configured (never sent out)."""
        return f"{self.prefix}ui:identity_key"

    @property
    def sweep_lock(self) -> str:
        return f"{self.prefix}sweep_lock"

    @property
    def stats(self) -> str:
        """Hash of counters: affinity_hits, affinity_misses, redispatched, reaped."""
        return f"{self.prefix}stats"

    @property
    def service_time(self) -> str:
        """Moving average of one job's run time in seconds (for queue ETAs)."""
        return f"{self.prefix}service_s"

    @property
    def celery_queue(self) -> str:
        return f"{self.prefix}jobs"

    # -- for Lua scripts -------------------------------------------------------------------------------------
    def script_keys(self) -> list[str]:
        """The fixed keys every script receives as KEYS[1..n], in the order ``worker.lua`` names them."""
        return [self.ring, self.served, self.queued_count, self.queued_by_user, self.queued_by_group,
                self.inflight_by_group, self.queued_since, self.inflight]

    def script_names(self) -> str:
        """JSON of the key prefixes a script needs for keys it discovers while running (ARGV[1])."""
        return json.dumps({"uq": self.user_queue(""), "gq": self.group_queue(""), "job": self.job(""),
                           "stream": self.stream(""), "conv": self.conversation(""), "turns": TURNS_SUFFIX,
                           "running": self.running(""), "holder": self.holder(""), "cancel": self.cancel(""),
                           "picture_jobs": self.picture_jobs(""), "images_of": self.images_of(""),
                           "usage": self.group_usage, "ring_key": self.ring_keys})
