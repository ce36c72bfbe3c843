"""A Redis URL as Owlet prints it (``owlet.redis_url.without_password``): the password never shows."""
from __future__ import annotations

import pytest

from owlet.redis_url import without_password


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://owlet:s3cret@10.0.0.1/2", "redis://owlet:***@10.0.0.1/2"),
    ("rediss://owlet:s3cret@[::1]:6380/0", "rediss://owlet:***@[::1]:6380/0"),
    ("unix://:s3cret@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("redis://cache:6379/0", "redis://cache:6379/0"),
    ("redis://owlet@cache:6379/0", "redis://owlet@cache:6379/0"),  # a user alone is no secret
    ("redis://:s3cret@cache:99999/0", "cache:99999/0"),  # unreadable port: everything before the host goes
])
def test_the_password_is_never_shown(url, shown):
    assert without_password(url) == shown
    assert "s3cret" not in without_password(url)
