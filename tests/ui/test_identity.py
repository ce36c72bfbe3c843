"""User identity: login beats browser id beats session; browser ids are validated, not trusted."""
from __future__ import annotations

import pytest

from ui.identity import ensure_browser_id, new_browser_id, resolve_user_id, valid_browser_id


def test_login_wins_over_browser_and_session():
    assert resolve_user_id("alice", new_browser_id(), "sess1") == "user:alice"


def test_browser_id_is_used_without_login_and_is_stable():
    bid = new_browser_id()
    assert resolve_user_id(None, bid, "sess1") == resolve_user_id(None, bid, "sess2") == f"browser:{bid}"


def test_session_is_last_resort_for_api_clients():
    assert resolve_user_id(None, None, "abc") == "session:abc"


@pytest.mark.parametrize("forged", ["../../etc", "user:alice", "", 42, None, "A" * 32, {"id": 1}])
def test_forged_or_missing_browser_ids_are_replaced(forged):
    assert not valid_browser_id(forged)
    fresh = ensure_browser_id(forged)
    assert valid_browser_id(fresh) and fresh != forged
    assert resolve_user_id(None, forged, "s") == "session:s"


def test_existing_browser_id_is_kept():
    bid = new_browser_id()
    assert ensure_browser_id(bid) == bid


def test_no_identity_at_all_is_an_error():
    with pytest.raises(ValueError):
        resolve_user_id(None, None, None)
