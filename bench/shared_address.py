"""The environment that lets N simulated users share one client address, derived from the settings themselves.

A benchmark's simulated users all come from 127.0.0.1, so the page's per-address limits (``ui.config.UIConfig``
fields named ``address_*``) and the workers' per-group limits (``worker.config.Settings`` fields naming ``group``:
a group is an address, or a login) would refuse them as one visitor. :func:`shared_address_env` gives one address
what N addresses would get: each such count or budget becomes its default times N. Windows (``*_window_s``) stay
as they are, since the count within them is what grows.

The fields are found by name, so a per-address limit added later is lifted without anyone remembering it here. One
this module cannot lift (a duration other than a window, a string, a flag) raises ``UnliftableLimit`` naming it, so
the benchmark fails at start-up, not with a 429 mid-run. ``tests/bench/test_shared_address.py`` checks that every
setting whose comment speaks of addresses or groups is either lifted or explained there.

Per-identity limits (``user_*``, ``*_user_*``) stay: each simulated user is its own identity, as a real visitor
is. Page-wide limits stay too, except where the page bounds one address by a share of them.
"""
from __future__ import annotations

import dataclasses
import math

from ui import config as ui_config
from ui.uploads.budget import ADDRESS_SHARE_OF_PAGE
from worker import config as worker_config

WINDOW_SUFFIX = "_window_s"


class UnliftableLimit(RuntimeError):
    """A per-address or per-group setting whose kind this module does not know how to scale."""


def per_address_fields(cls, word: str) -> list[dataclasses.Field]:
    """The fields of settings class ``cls`` whose name has ``word`` as one of its ``_``-separated parts."""
    return [f for f in dataclasses.fields(cls) if word in f.name.split("_")]


def lifted_values(cls, word: str, users: int) -> dict[str, int | float]:
    """``{field: default x users}`` for each per-address field of ``cls`` (windows left out)."""
    values = {}
    for f in per_address_fields(cls, word):
        if f.name.endswith(WINDOW_SUFFIX):
            continue
        if f.name.endswith("_s") or type(f.default) not in (int, float):
            raise UnliftableLimit(f"{cls.__name__}.{f.name} is per {word} but not a count or a budget: teach "
                                  f"bench/shared_address.py how N users sharing one {word} should set it")
        values[f.name] = f.default * users
    return values


def page_values(users: int) -> dict[str, int | float]:
    """The page's per-address limits for ``users`` sharing one address, and the page total that bounds them."""
    values = lifted_values(ui_config.UIConfig, "address", users)
    # The page lets one address take only ADDRESS_SHARE_OF_PAGE of its whole upload budget (ui.uploads.budget),
    # so that total must grow until the lifted per-address budget fits in the share.
    share_needs = math.ceil(values["address_upload_bytes"] / ADDRESS_SHARE_OF_PAGE)
    values["upload_cache_max_bytes"] = max(ui_config.UIConfig.upload_cache_max_bytes, share_needs)
    return values


def worker_values(users: int) -> dict[str, int | float]:
    """The workers' per-group limits (admission, image and text quotas) for ``users`` sharing one address."""
    return lifted_values(worker_config.Settings, "group", users)


def shared_address_env(users: int) -> dict[str, str]:
    """``OWLET_UI_*`` and ``OWLET_*`` variables letting ``users`` simulated users share one address.

    Both settings classes are built from the result, so a combination they refuse fails here, at start-up."""
    assert users >= 1, f"users must be at least 1, got {users}"
    page, worker = page_values(users), worker_values(users)
    env = {ui_config.ENV_PREFIX + name.upper(): str(value) for name, value in page.items()}
    env.update({worker_config.ENV_PREFIX + name.upper(): str(value) for name, value in worker.items()})
    ui_config.UIConfig.from_env(env)
    worker_config.Settings.from_env(env)
    return env
