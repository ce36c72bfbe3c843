"""Identity: a login beats a token; anonymous tokens verify only under the server's key; the client address
comes from the socket unless a named trusted proxy forwards it."""
from __future__ import annotations

import types

import pytest

from ui.config import UIConfig
from ui.identity import (ClientAddresses, IdentityIssuer, IdentityRequired, counted_address, identify,
                         parse_networks)

ISSUER = IdentityIssuer(b"k" * 32)


def request(host="203.0.113.7", username=None, forwarded=None, session_hash="s"):
    headers = {"x-forwarded-for": forwarded} if forwarded else {}
    return types.SimpleNamespace(client=types.SimpleNamespace(host=host), username=username, headers=headers,
                                 session_hash=session_hash)


def test_login_wins_and_groups_by_login():
    caller = identify(request(username="alice"), ISSUER.mint(), ISSUER)
    assert (caller.user, caller.group) == ("user:alice", "login:alice")


def test_minted_token_verifies_and_is_stable_across_sessions():
    token = ISSUER.mint()
    a, b = identify(request(session_hash="s1"), token, ISSUER), identify(request(session_hash="s2"), token, ISSUER)
    assert a == b and a.user.startswith("anon:") and a.group == "addr:203.0.113.7"


@pytest.mark.parametrize("forged", ["../../etc", "user:alice", "", 42, None, "a" * 32, {"id": 1},
                                    "v1." + "a" * 32 + "." + "0" * 32, "v1." + "a" * 32 + ".\u00e9",
                                    "v1." + "\u00e9" * 32 + ".00"])
def test_forged_or_missing_tokens_are_refused_and_replaced(forged):
    with pytest.raises(IdentityRequired):
        identify(request(), forged, ISSUER)
    fresh = ISSUER.ensure(forged)
    assert ISSUER.verify(fresh) and fresh != forged


def test_a_token_from_another_key_does_not_verify():
    assert IdentityIssuer(b"x" * 32).verify(ISSUER.mint()) is None


def test_session_hash_is_never_an_identity():
    with pytest.raises(IdentityRequired):
        identify(request(session_hash="victim-session"), None, ISSUER)


def test_forwarded_for_counts_only_through_a_trusted_proxy():
    proxies = ClientAddresses(parse_networks("127.0.0.1, 10.0.0.0/8"))
    spoof = request(host="198.51.100.9", forwarded="1.2.3.4")
    assert proxies.of(spoof) == "198.51.100.9", "an untrusted peer's header is ignored"
    via_proxy = request(host="127.0.0.1", forwarded="6.6.6.6, 198.51.100.9, 10.1.2.3")
    assert proxies.of(via_proxy) == "198.51.100.9", "right-most hop that is not a trusted proxy"
    assert ClientAddresses().of(via_proxy) == "127.0.0.1", "no trusted proxies: the socket peer"


def test_every_forwarded_for_line_counts_and_ports_are_dropped():
    """A proxy that adds its own X-Forwarded-For line (rather than appending to the client's) put the true hop on the
    second line, and only the first, the client's own, was read: any client could name its address. Hops written
    with a port fell back to the proxy's address, making every client one."""
    from starlette.datastructures import Headers

    proxies = ClientAddresses(parse_networks("127.0.0.1"))
    two_lines = Headers(raw=[(b"x-forwarded-for", b"198.51.100.7"), (b"x-forwarded-for", b"203.0.113.9")])
    spoofed = types.SimpleNamespace(client=types.SimpleNamespace(host="127.0.0.1"), headers=two_lines)
    assert proxies.of(spoofed) == "203.0.113.9", "the proxy's line, the last, names the client"
    for hop, address in (("203.0.113.9:5123", "203.0.113.9"), ("[2001:db8:1:2::7]:443", "2001:db8:1:2::/64")):
        assert proxies.of(request(host="127.0.0.1", forwarded=f"6.6.6.6, {hop}")) == address, hop


def test_an_ipv6_client_counts_as_its_network_and_a_mapped_ipv4_as_itself():
    # One subscriber holds a whole /64 and can pick any address in it for every request.
    a, b = "2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:fffe"
    assert counted_address(a) == counted_address(b) == "2001:db8:1:2::/64"
    assert counted_address("2001:db8:1:3::1") != counted_address(a), "the next /64 is someone else"
    assert counted_address(a, ipv6_prefix=48) == counted_address("2001:db8:1:ff::1", ipv6_prefix=48)
    assert counted_address("::ffff:198.51.100.9") == "198.51.100.9"
    assert counted_address("198.51.100.9") == "198.51.100.9"
    assert counted_address("testclient") == "testclient", "not an IP: counted as given"
    proxies = ClientAddresses(parse_networks("127.0.0.1"))
    via_proxy = request(host="127.0.0.1", forwarded="2001:DB8:1:2::abcd")
    assert proxies.of(via_proxy) == "2001:db8:1:2::/64"
    assert ClientAddresses().of(request(host="2001:db8:9:9::5")) == "2001:db8:9:9::/64", "a direct IPv6 peer too"
    caller = identify(request(host="127.0.0.1", forwarded=b), ISSUER.mint(), ISSUER, proxies)
    assert caller.group == "addr:2001:db8:1:2::/64"


def test_bad_trusted_proxy_is_named():
    with pytest.raises(ValueError, match="not-an-ip"):
        parse_networks("127.0.0.1,not-an-ip")


def test_the_share_tunnel_names_each_visitor_by_its_own_hop_only():
    """Gradio's share server (frp) appends the address it saw to X-Forwarded-For, and the tunnel's client on this host
    connects from loopback: that right-most hop is the visitor. Entries the visitor wrote further left, even a
    loopback address, count for nothing; a loopback request without the header is this host."""
    tunnel = ClientAddresses.from_config(UIConfig(share=True))
    assert tunnel.share_tunnel and not tunnel.trusted_proxies
    assert tunnel.of(request(host="127.0.0.1", forwarded="198.51.100.9")) == "198.51.100.9"
    for forged in ("6.6.6.6, 198.51.100.9", "127.0.0.1, 198.51.100.9", "10.0.0.1,198.51.100.9"):
        assert tunnel.of(request(host="127.0.0.1", forwarded=forged)) == "198.51.100.9", forged
    assert tunnel.of(request(host="::1", forwarded="2001:db8:5:6::1")) == "2001:db8:5:6::/64"
    assert tunnel.of(request(host="127.0.0.1")) == "127.0.0.1", "no header: the host itself"
    assert tunnel.of(request(host="127.0.0.1", forwarded="198.51.100.9, not-an-address")) == "127.0.0.1"
    assert tunnel.of(request(host="203.0.113.7", forwarded="198.51.100.9")) == "203.0.113.7", \
        "a visitor reaching the page directly names no one"
    assert not ClientAddresses.from_config(UIConfig()).share_tunnel, "without --share loopback's header is ignored"
    operator = ClientAddresses.from_config(UIConfig(share=True, trusted_proxies=("10.0.0.0/8",)))
    assert not operator.share_tunnel, "the operator's trusted proxies win"
    assert operator.of(request(host="127.0.0.1", forwarded="198.51.100.9")) == "127.0.0.1"


def test_private_trusts_a_platforms_proxy_on_any_private_network_and_no_visitor():
    space = ClientAddresses.from_config(UIConfig(trusted_proxies=("private",)))
    for proxy in ("10.20.30.40", "172.17.0.3", "192.168.1.2", "100.64.0.9", "127.0.0.1", "fd00::5"):
        assert space.of(request(host=proxy, forwarded="6.6.6.6, 198.51.100.9, 10.0.0.7")) == "198.51.100.9", proxy
    assert space.of(request(host="198.51.100.20", forwarded="1.2.3.4")) == "198.51.100.20", "a public peer"


def test_a_client_header_names_the_visitor_only_from_the_proxies_named():
    """Cloudflare's edge names the visitor in CF-Connecting-IP; cloudflared on this host passes it on."""
    from starlette.datastructures import Headers

    tunnel = ClientAddresses.from_config(UIConfig(trusted_proxies=("127.0.0.1",), client_header="CF-Connecting-IP"))

    def via(host: str, *lines: tuple[bytes, bytes]):
        return types.SimpleNamespace(client=types.SimpleNamespace(host=host), headers=Headers(raw=list(lines)))

    named = via("127.0.0.1", (b"x-forwarded-for", b"6.6.6.6"), (b"cf-connecting-ip", b"198.51.100.9"))
    assert tunnel.of(named) == "198.51.100.9", "the header, never X-Forwarded-For"
    assert tunnel.of(via("127.0.0.1", (b"x-forwarded-for", b"198.51.100.9"))) == "127.0.0.1", "no header: the proxy"
    assert tunnel.of(via("203.0.113.5", (b"cf-connecting-ip", b"198.51.100.9"))) == "203.0.113.5", \
        "not from a named proxy: the peer"
    assert tunnel.of(via("127.0.0.1", (b"cf-connecting-ip", b"garbage"))) == "127.0.0.1"
    with pytest.raises(ValueError, match="trusted proxies"):
        UIConfig(client_header="CF-Connecting-IP")


def test_the_page_says_which_front_it_believes():
    assert "share server" in ClientAddresses.from_config(UIConfig(share=True)).front()
    assert "CF-Connecting-IP" in ClientAddresses.from_config(
        UIConfig(trusted_proxies=("127.0.0.1",), client_header="CF-Connecting-IP")).front()
    assert "X-Forwarded-For" in ClientAddresses.from_config(UIConfig(trusted_proxies=("10.0.0.5",))).front()
    assert "OWLET_UI_TRUSTED_PROXIES" in ClientAddresses.from_config(UIConfig()).front()
