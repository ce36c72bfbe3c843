"""Who is asking, decided by the server (``Caller``): the user (a login, or an anonymous identity only the server
can mint), the group whose share of the queue the user draws on, and the network address the request came from.

Anonymous identities are tokens ``v1.<random>.<signature>``, signed with HMAC-SHA256 under a server-only key
(``OWLET_UI_IDENTITY_KEY``, or one kept in Redis). The key is never sent to a browser, so a client can keep
and present a token but cannot make one up: a value that does not verify is refused and replaced, never
trusted. Gradio's ``session_hash`` is chosen by the client and is never an identity.

Browsers get a token on page load (kept in localStorage by ``gr.BrowserState``); API clients call the
``/identity`` endpoint the same way and pass the token back as ``browser_id`` on every call. The OpenAI-compatible API
takes the same token as its bearer key, and with logins a login's key (``l1.<login>.<signature>``, signed with the
same key), which names the login (``ui.api.api_keys``).

The group is what the worker's fairness and quotas count: the login for logged-in users, otherwise the client's address.
The address is what the page's own per-address limits count, for everyone (connections, uploads, events, decodes in this
process). ``ClientAddresses`` decides it, for the front the page sits behind:

- no front named: the socket's peer;
- a proxy the operator named in ``trusted_proxies`` (addresses, networks, or ``private`` for every private and loopback
  network): the right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy, or, with ``client_header``
  (``CF-Connecting-IP``), the address that header names, read only from those proxies;
- Gradio's share link (``--share`` with no trusted proxies): on a connection from loopback, the right-most
  ``X-Forwarded-For`` entry, which is the address the share server (frp) saw and appended; the tunnel's client on this
  host opens every visitor's connection from 127.0.0.1. Entries further left were written by the visitor and count for
  nothing, and a loopback request without the header is this host itself.

An IPv6 client counts as its whole network prefix (``ipv6_prefix`` bits, a /64 by default): one subscriber is handed at
least a /64 and may use any address in it, so counting single IPv6 addresses would give one person 2^64 shares of every
per-address limit. An IPv4-mapped IPv6 peer (``::ffff:a.b.c.d``) counts as its IPv4.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass

TOKEN_VERSION = "v1"
LOGIN_KEY_VERSION = "l1"  # an API key naming a login (with --auth), signed with the same server-only key
MAX_LOGIN_KEY_CHARS = 300
UNKNOWN_ADDRESS = "unknown"
DEFAULT_IPV6_PREFIX = 64


class IdentityRequired(ValueError):
    """The call carried no identity the server can verify; ``user_message`` says how to get one."""

    user_message = ("This page could not tell who you are (your identity token is missing or not valid). "
                    "Reload the page. API clients: call the /identity endpoint and pass the token it returns "
                    "as browser_id.")
    api_message = "The API key is missing or not valid."  # what an API client is told instead
    metric_kind, http_status, api_code = "no_identity", 401, "invalid_api_key"


@dataclass(frozen=True)
class Caller:
    """The identity that owns conversations and jobs, and the group whose share of the queue it draws on."""
    user: str  # "user:<login>" or "anon:<id>"
    group: str  # "login:<login>" or "addr:<address>"
    address: str  # the client address as the server determined it (for per-address limits in this process)


class IdentityIssuer:
    """Mints and verifies anonymous identity tokens with one server-only key."""

    def __init__(self, key: bytes):
        assert len(key) >= 16, "the identity key must be at least 16 bytes"
        self._key = key

    def _sign(self, ident: str) -> str:
        return hmac.new(self._key, f"{TOKEN_VERSION}.{ident}".encode(), hashlib.sha256).hexdigest()[:32]

    def mint(self) -> str:
        ident = secrets.token_hex(16)
        return f"{TOKEN_VERSION}.{ident}.{self._sign(ident)}"

    def verify(self, token: object) -> str | None:
        """The identity inside a token this server minted; None for anything else."""
        if not isinstance(token, str) or len(token) > 100:
            return None
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != TOKEN_VERSION or len(parts[1]) != 32:
            return None
        if not parts[2].isascii():  # compare_digest raises on non-ASCII str: a forged token, not a server error
            return None
        if not hmac.compare_digest(parts[2], self._sign(parts[1])):
            return None
        return parts[1]

    def ensure(self, token: object) -> str:
        """``token`` when it verifies, otherwise a fresh one (page load and the /identity endpoint)."""
        return token if self.verify(token) else self.mint()

    def login_key(self, login: str) -> str:
        """The API key of a login (``l1.<login in hex>.<signature>``): it names the login, and only this server can
        make one. It stays valid while the identity key does and the login is configured."""
        name = login.encode().hex()
        return f"{LOGIN_KEY_VERSION}.{name}.{self._sign_login(name)}"

    def verify_login_key(self, key: object) -> str | None:
        """The login a key this server made names; None for anything else."""
        if not isinstance(key, str) or len(key) > MAX_LOGIN_KEY_CHARS:
            return None
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != LOGIN_KEY_VERSION or not parts[1] or not parts[2].isascii():
            return None
        if not hmac.compare_digest(parts[2], self._sign_login(parts[1])):
            return None
        try:
            return bytes.fromhex(parts[1]).decode()
        except ValueError:
            return None

    def _sign_login(self, name_hex: str) -> str:
        return hmac.new(self._key, f"{LOGIN_KEY_VERSION}.{name_hex}".encode(), hashlib.sha256).hexdigest()[:32]


# ``private`` in the trusted proxies: every network a platform's own proxy may speak from (a Hugging Face Space, a
# container platform), and none a visitor on the internet can: loopback, RFC 1918, carrier-grade NAT, IPv6 unique
# local and link-local.
PRIVATE_NETWORKS = ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "::1/128",
                    "fc00::/7", "fe80::/10")
PRIVATE = "private"
FORWARDED_FOR = "x-forwarded-for"


def parse_networks(spec) -> tuple:
    """``"127.0.0.1, 10.0.0.0/8"`` or ``"private"`` (or a sequence) -> ip networks; raises ValueError naming a bad
    entry."""
    if isinstance(spec, str):
        spec = [s for s in spec.split(",")]
    nets = []
    for item in spec or ():
        item = item.strip()
        if item.lower() == PRIVATE:
            nets.extend(ipaddress.ip_network(n) for n in PRIVATE_NETWORKS)
        elif item:
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"trusted proxy {item!r} is not an IP address or network (or {PRIVATE!r})") from None
    return tuple(nets)


def _trusted(address: str, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def counted_address(address: str, ipv6_prefix: int = DEFAULT_IPV6_PREFIX) -> str:
    """What per-address limits count for `address`: the IPv4 address, or the IPv6 network it belongs to."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a test client, a Unix socket): counted as given
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/{ipv6_prefix}", strict=False))
    return str(ip)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _address(hop: str) -> str | None:
    """The IP address one forwarded hop names (a port dropped), or None for anything else."""
    try:
        return str(ipaddress.ip_address(_without_port(hop.strip())))
    except ValueError:
        return None


@dataclass(frozen=True)
class ClientAddresses:
    """How this page tells clients apart: which proxies it believes (parsed networks) and through which header,
    whether it sits behind Gradio's share tunnel, and how wide an IPv6 client's network is. Built once from the
    page's config; `of` is what every per-address limit counts, `front` says in a sentence what the page believes."""

    trusted_proxies: tuple = ()
    ipv6_prefix: int = DEFAULT_IPV6_PREFIX
    client_header: str = "X-Forwarded-For"  # or a header naming one address, set by the proxy (CF-Connecting-IP)
    share_tunnel: bool = False  # believe the right-most X-Forwarded-For entry on loopback connections

    @classmethod
    def from_config(cls, config) -> "ClientAddresses":
        proxies = parse_networks(config.trusted_proxies)
        # The operator's trusted proxies win over the share link's default.
        return cls(proxies, config.ipv6_prefix, config.client_header or "X-Forwarded-For",
                   share_tunnel=bool(config.share) and not proxies)

    def of(self, request) -> str:
        """The client's address as limits count it (see counted_address): the socket peer, or what the front
        this page believes says it is."""
        client = getattr(request, "client", None) if request is not None else None
        peer = getattr(client, "host", None) or UNKNOWN_ADDRESS
        return counted_address(self._client_ip(request, peer), self.ipv6_prefix)

    def front(self) -> str:
        """Which front the page believes, in a sentence for the start-up log."""
        if self.trusted_proxies:
            proxies = ", ".join(str(n) for n in self.trusted_proxies)
            header = "X-Forwarded-For (its right-most entry that is not a trusted proxy)" \
                if self.client_header.lower() == FORWARDED_FOR else self.client_header
            return (f"a visitor is the address {header} names on connections from the trusted proxies ({proxies}); "
                    "any other connection is its own address")
        if self.share_tunnel:
            return ("behind the share link, a visitor is the address Gradio's share server saw (the right-most "
                    "X-Forwarded-For entry on connections from this host); any other connection is its own address")
        return ("each connection is its own address (no proxy trusted: behind a proxy, name it in "
                "OWLET_UI_TRUSTED_PROXIES)")

    def _client_ip(self, request, peer: str) -> str:
        if self.trusted_proxies and _trusted(peer, self.trusted_proxies):
            if self.client_header.lower() != FORWARDED_FOR:
                return self._named_by_header(request, peer)
            return self._walk_forwarded(request, peer)
        if self.share_tunnel and _loopback(peer):
            # The tunnel's own hop only: frp appends the address it saw, so anything left of it is the visitor's
            # own writing. No header at all: this host itself asked.
            hops = _forwarded_hops(request)
            return (_address(hops[-1]) or peer) if hops else peer
        return peer

    def _walk_forwarded(self, request, peer: str) -> str:
        # Each proxy appends the address it saw, so walk from the right past the proxies we trust; anything
        # further left was written by the client and proves nothing.
        for hop in reversed(_forwarded_hops(request)):
            address = _address(hop)
            if address is None:
                return peer  # garbage where an address should be: fall back to the proxy itself
            if not _trusted(address, self.trusted_proxies):
                return address
        return peer

    def _named_by_header(self, request, peer: str) -> str:
        """A header that names one address (Cloudflare's CF-Connecting-IP), set by the trusted proxy: its last line
        and last entry, which is the proxy's own writing."""
        lines = _header_lines(getattr(request, "headers", None), self.client_header.lower())
        if not lines:
            return peer
        return _address(lines[-1].split(",")[-1]) or peer


def _forwarded_hops(request) -> list[str]:
    """Every X-Forwarded-For entry, in order, from every line of the header: a proxy may add a line of its own
    rather than append to the client's, and reading only the first line would believe the client's."""
    forwarded = ",".join(_header_lines(getattr(request, "headers", None), FORWARDED_FOR))
    return [h.strip() for h in forwarded.split(",") if h.strip()]


def _header_lines(headers, name: str) -> list[str]:
    """Every value of header ``name`` (Starlette's headers keep repeated lines apart), else the one value."""
    if headers is None:
        return []
    if hasattr(headers, "getlist"):
        return list(headers.getlist(name))
    value = headers.get(name, "") if hasattr(headers, "get") else ""
    return [value] if value else []


def _without_port(hop: str) -> str:
    """An X-Forwarded-For hop without the port some load balancers add ("203.0.113.9:1234", "[2001:db8::1]:443")."""
    if hop.startswith("["):
        return hop[1:].split("]", 1)[0]
    if hop.count(":") == 1:  # IPv4 with a port (a bare IPv6 address has two colons or more)
        return hop.split(":", 1)[0]
    return hop


DIRECT = ClientAddresses()  # no front: every client is its socket peer


def login_caller(login: str, address: str) -> Caller:
    """A signed-in user: the login is the identity and the group."""
    return Caller(f"user:{login}", f"login:{login}", address)


def anonymous_caller(ident: str, address: str) -> Caller:
    """An anonymous identity (from a verified token): its group is its client address."""
    return Caller(f"anon:{ident}", f"addr:{address}", address)


def identify(request, token: object, issuer: IdentityIssuer, addresses: ClientAddresses = DIRECT) -> Caller:
    """The caller of a page event; raises IdentityRequired when an anonymous caller has no valid token."""
    address = addresses.of(request)
    username = getattr(request, "username", None) if request is not None else None
    if username:
        return login_caller(username, address)
    ident = issuer.verify(token)
    if ident is None:
        raise IdentityRequired()
    return anonymous_caller(ident, address)


def issuer_for(config, client, log=None) -> IdentityIssuer:
    """The issuer for this page: the operator's key, else the one kept in Redis, else (Redis down at start)
    a random key for this process only, with a warning that identities will not survive a restart."""
    if config.identity_key:
        return IdentityIssuer(config.identity_key.encode())
    try:
        return IdentityIssuer(client.identity_key())
    except Exception:
        if log is not None:
            log.warning("Redis unreachable at start: anonymous identities use a per-process key until restart")
        return IdentityIssuer(secrets.token_bytes(32))
