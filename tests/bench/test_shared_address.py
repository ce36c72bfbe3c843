"""bench.shared_address lifts every per-address and per-group limit for N users sharing one address.

The page's and the workers' settings are enumerated, so a limit added later without being lifted fails here, not
as a 429 in the middle of a benchmark. A setting whose comment speaks of addresses or groups but whose name does
not say so must be lifted or explained in ``NOT_SHARED_LIMITS``.
"""
from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from bench.shared_address import UnliftableLimit, lifted_values, per_address_fields, shared_address_env
from ui.config import UIConfig
from ui.server import upload_ledger
from worker.config import Settings

USERS = 64

# Settings that mention addresses or groups without being a limit one address or group reaches, and why they stay.
NOT_SHARED_LIMITS = {
    "trusted_proxies": "how a client's address is found, not a limit",
    "ipv6_prefix": "how an address is counted, not a limit",
    "user_queue_cap": "per identity: each simulated user is its own identity, as a visitor is",
    "image_quota_user_bytes": "per identity",
    "text_quota_user_bytes": "per identity",
    "image_quota_total_bytes": "the whole service's: N addresses share it too",
}
SPEAKS_OF_ADDRESSES = re.compile(r"address|\bgroups?\b|per (client|network|login)", re.IGNORECASE)
FIELD_LINE = re.compile(r"^    (\w+)\s*:[^=]+=")  # a class-level annotation, not one in a method


def commented_fields(cls) -> dict[str, str]:
    """``{field: its comment}`` from the class source: the comment lines just above a field and its own."""
    comments, block = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped)
            continue
        match = FIELD_LINE.match(line)
        if match:
            comments[match.group(1)] = " ".join(block + [line.partition("#")[2]])
        block = []
    return comments


def test_every_per_address_page_limit_lets_the_users_in_as_many_addresses_would():
    config = UIConfig.from_env(shared_address_env(USERS))
    fields = per_address_fields(UIConfig, "address")
    assert {f.name for f in fields} >= {"address_max_events", "address_max_uploads", "address_upload_bytes"}
    for f in fields:
        value = getattr(config, f.name)
        if f.name.endswith("_window_s"):
            assert value == f.default, f"{f.name}: a window stays as it is"
        else:
            assert value >= f.default * USERS, f"{f.name} is not lifted for {USERS} users: {value}"


def test_the_page_lets_one_address_take_the_lifted_upload_budget():
    """The upload ledger caps one address at a share of the page's budget, whatever address_upload_bytes says."""
    ledger = upload_ledger(UIConfig.from_env(shared_address_env(USERS)))
    assert ledger.address_share_bytes >= USERS * UIConfig.address_upload_bytes


def test_every_per_group_worker_limit_lets_the_users_in_as_many_groups_would():
    settings = Settings.from_env(shared_address_env(USERS))
    fields = per_address_fields(Settings, "group")
    assert {f.name for f in fields} >= {"group_job_cap", "group_submit_limit"}
    for f in fields:
        value = getattr(settings, f.name)
        if f.name.endswith("_window_s"):
            assert value == f.default
        else:
            assert value >= f.default * USERS, f"{f.name} is not lifted for {USERS} users: {value}"


@pytest.mark.parametrize("cls, word", [(UIConfig, "address"), (Settings, "group")])
def test_settings_that_speak_of_addresses_or_groups_are_lifted_or_explained(cls, word):
    lifted = {f.name for f in per_address_fields(cls, word)}
    comments = commented_fields(cls)
    assert set(comments) == {f.name for f in dataclasses.fields(cls)}, "the comment reader missed a field"
    unexplained = [name for name, comment in comments.items()
                   if SPEAKS_OF_ADDRESSES.search(comment) and name not in lifted and name not in NOT_SHARED_LIMITS]
    assert not unexplained, (f"{cls.__name__} settings speak of addresses or groups but bench.shared_address does "
                             f"not lift them: {unexplained}; name them {word}_* or explain them in NOT_SHARED_LIMITS")


def test_a_per_address_setting_it_cannot_scale_fails_loudly():
    @dataclasses.dataclass(frozen=True)
    class Counts:
        address_max_things: int = 3
        address_things_window_s: float = 60.0

    @dataclasses.dataclass(frozen=True)
    class WithTimeout(Counts):
        address_idle_timeout_s: float = 5.0

    @dataclasses.dataclass(frozen=True)
    class WithWord(Counts):
        address_mode: str = "strict"

    assert lifted_values(Counts, "address", 4) == {"address_max_things": 12}
    with pytest.raises(UnliftableLimit, match="address_idle_timeout_s"):
        lifted_values(WithTimeout, "address", 4)
    with pytest.raises(UnliftableLimit, match="address_mode"):
        lifted_values(WithWord, "address", 4)
