"""Settings for the web page: one frozen dataclass, filled from ``OWLET_UI_*`` variables and the command line.

Upload limits are settings here, because uploads are checked at the edge (the page) before they reach Redis;
their defaults are defined once for every layer in ``engine.limits``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from engine import limits
from owlet.settings import SettingError, read_fields
from ui.identity import parse_networks

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
ENV_PREFIX = "OWLET_UI_"  # field max_threads is read from OWLET_UI_MAX_THREADS
ENV_SKIP = ("redis_url", "key_prefix")  # read from REDIS_URL and OWLET_KEY_PREFIX, shared with the workers
# A fixed default keeps browser ids stable across restarts of a local demo; deployments set OWLET_UI_SECRET.
DEV_BROWSER_SECRET = "owlet-local-demo-secret-change-me"


def parse_auth(pairs: list[str] | tuple[str, ...] | str | None) -> tuple[tuple[str, str], ...]:
    """Turn ``user:pass`` strings (or one comma-separated string) into (user, password) pairs."""
    if not pairs:
        return ()
    if isinstance(pairs, str):
        pairs = [p for p in pairs.split(",") if p.strip()]
    result = []
    for pair in pairs:
        user, sep, password = pair.strip().partition(":")
        if not sep or not user or not password:
            raise ValueError(f"--auth expects user:password, got {pair!r}")
        result.append((user, password))
    return tuple(result)


@dataclass(frozen=True)
class UIConfig:
    host: str = "127.0.0.1"
    port: int = 7860
    share: bool = False
    auth: tuple[tuple[str, str], ...] = ()
    redis_url: str = DEFAULT_REDIS_URL
    key_prefix: str = ""  # "" = the worker side's default; tests set their own namespace
    # Where visitors reach the page when a reverse proxy serves it under a path of its own (https://example.com/owlet/
    # with the proxy stripping /owlet): "/owlet". Gradio builds the page's URLs with it; "" = served at the root.
    root_path: str = ""
    # OWLET_UI_SECRET: what Gradio's BrowserState encrypts the browser id kept in localStorage with. Gradio sends it to
    # every page (its /config), so it hides nothing from a visitor; the id is safe because it is signed (identity_key).
    secret: str = DEV_BROWSER_SECRET
    # Gradio: how many events may run at once. Each open answer stream holds one thread, so this caps
    # concurrent streams for the whole page; Gradio's own queue runs events with no per-event limit.
    max_threads: int = 64
    queue_max_size: int = 512  # events waiting in Gradio's queue beyond max_threads; more get "queue full"
    # Uploads, checked before anything reaches Redis.
    max_upload_bytes: int = limits.UPLOAD_MAX_BYTES
    max_image_pixels: int = limits.DECODE_MAX_PIXELS  # decoded pixels; more is treated as a decompression bomb
    max_image_side: int = limits.MAX_SIDE  # larger images are downscaled (keeps vision tokens bounded)
    allowed_formats: tuple[str, ...] = limits.ALLOWED_FORMATS
    max_text_chars: int = 4000
    # Any request body but an upload: a question's JSON is a few KB, so more is refused unread (ui.edge.body_limits).
    max_request_bytes: int = 96 * 1024  # twice the longest question (4,000 emoji, JSON-escaped: 48 KB)
    # The OpenAI-compatible API (ui.api): a chat completion's body, which carries its pictures as base64 (a third
    # larger than their bytes) and the whole conversation's text; and the bytes of such bodies, when over
    # max_request_bytes, that the page reads at once (each client: as many as its uploads arriving at once).
    api_max_request_bytes: int = 16 * 1024 * 1024
    api_bodies_max_bytes: int = 256 * 1024 * 1024
    api_keepalive_s: float = 10.0  # a streamed API answer waiting in the queue sends a keep-alive comment this often
    upload_cache_ttl_s: int = 3600  # Gradio's upload cache: files older than this are deleted, checked as often
    # Upload budgets (ui.uploads.budget): bytes one address may upload per window, and bytes the whole page
    # accepts over twice the cache TTL (what Gradio's upload cache can hold at most).
    address_upload_bytes: int = 128 * 1024 * 1024
    address_upload_window_s: float = 600.0
    upload_cache_max_bytes: int = 4 * 1024 * 1024 * 1024
    # Seconds between calls to glibc's malloc_trim(0), which gives the heap's freed pages back (owlet/allocator.py);
    # 0 = never.
    malloc_trim_s: float = 30.0
    # Closed tabs' Gradio state the page keeps (Gradio's own default is 10,000, about 30-60 KB each); open tabs
    # are never dropped (ui/gradio_adapters/tab_states.py), the least recently used closed ones go first.
    tab_states_max: int = 1000
    decode_workers: int = 2  # threads of the pool that decodes uploads (never the handlers' shared pool)
    # Running it in public (see docs/security.md).
    identity_key: str = ""  # OWLET_UI_IDENTITY_KEY signs anonymous identities; "" = a random key kept in Redis
    # The front the page sits behind (ui.identity.ClientAddresses): proxies (addresses, networks, or "private") whose
    # X-Forwarded-For names the client address, and another header they name it in instead (CF-Connecting-IP).
    # With --share and no trusted proxies, the share tunnel's own X-Forwarded-For hop names each visitor.
    trusted_proxies: tuple[str, ...] = ()
    client_header: str = ""
    ipv6_prefix: int = 64  # an IPv6 client counts as its /64 (what one subscriber gets) for per-address limits
    metrics_token: str = ""  # bearer token for /metrics and a detailed /healthz; "" = /metrics is off
    address_max_events: int = 4  # page events (answer streams) one client address may hold at once
    # Events one address may have waiting for a Gradio slot (ui/gradio_adapters/fair_event_slots.py).
    address_max_waiting_events: int = 8
    # New Gradio sessions (tabs, page loads, API clients) one address may open per window (ui/edge/tab_budget.py):
    # a flood of them would push other visitors' tab state out of Gradio's 10,000-session memory.
    address_new_sessions: int = 240
    address_new_sessions_window_s: float = 600.0
    address_max_decodes: int = 1  # image decodes one client address may run at once
    address_max_uploads: int = 4  # uploads one client address may have arriving at once (ui.uploads.budget)
    # Requests that stay open (heartbeat, event and result streams, POSTs) one address may hold at once, and
    # how long a POST's body (an upload above all) may take to arrive (ui/edge/held_connections.py).
    address_max_connections: int = 32
    upload_timeout_s: float = 120.0
    # Other GETs (the page's files, served pictures) one address may be downloading at once; a page load
    # fetches dozens of files, so this is higher (ui/edge/held_connections.py).
    address_max_downloads: int = 128
    # Refusals one address may receive per window before its asking requests are braked: refused after a delay,
    # before any work (ui/edge/refusal_brake.py). A client that waits as each refusal says never gets there.
    address_refusals: int = 20
    address_refusals_window_s: float = 60.0
    # With --auth: sign-in attempts one address may make per account per window, right or wrong (ui/ops/endpoints.py).
    address_logins: int = 20
    address_logins_window_s: float = 600.0
    # Serve even when the installed Gradio is not the one Owlet's adaptations of its internals were verified with,
    # or one of them does not apply: the page then runs without the defences named in its start-up log
    # (ui/gradio_adapters/registry.py). Off: such a page refuses to start.
    allow_unverified_gradio: bool = False
    # Generation requested per turn.
    max_new_tokens: int = 256  # the default answer length
    max_new_tokens_cap: int = 1024  # the most a user may ask for with the "answer length" slider
    temperature: float = 0.0
    # A stream with no event for this long is reported as a lost worker and cancelled: no spinner forever.
    stall_timeout_s: float = 120.0
    queue_poll_s: float = 1.0  # how often the "You are 3rd in line" line refreshes
    stream_min_interval_s: float = 0.05  # at most 20 chat updates a second per answer, however fast the model
    # The page's total streamed-update budget, shared fairly by the answers streaming at once (ui.chat.pacing);
    # each still gets at least stream_min_updates_per_s.
    page_max_updates_per_s: float = 400.0
    stream_min_updates_per_s: float = 4.0
    stream_read_tick_s: float = 0.02  # the stream hub reads all followed streams at most this often

    def __post_init__(self):
        _require(0 < self.port < 65536, f"port must be 1..65535, got {self.port}")
        problem = root_path_problem(self.root_path)
        _require(problem is None, problem or "")
        _require(self.max_threads >= 1, "max_threads must be at least 1")
        _require(self.queue_max_size >= 1, "queue_max_size must be at least 1")
        _require(self.max_upload_bytes > 0 and self.max_image_pixels > 0, "upload limits must be positive")
        _require(self.max_request_bytes >= 16 * self.max_text_chars,
                 "max_request_bytes must hold a question of max_text_chars (JSON-escaped)")
        _require(self.api_max_request_bytes >= 4 * (self.max_upload_bytes // 3 + 1) + self.max_request_bytes,
                 "api_max_request_bytes must hold a picture of max_upload_bytes as base64 and a question")
        _require(self.api_bodies_max_bytes >= self.api_max_request_bytes,
                 "api_bodies_max_bytes must hold one body of api_max_request_bytes")
        _require(self.api_keepalive_s > 0, "api_keepalive_s must be positive")
        _require(self.max_image_side >= 32, "max_image_side must be at least 32 px")
        _require(self.allowed_formats, "at least one image format must be allowed")
        _require(1 <= self.max_new_tokens <= self.max_new_tokens_cap, "need 1 <= max_new_tokens <= max_new_tokens_cap")
        _require(self.stall_timeout_s > 0 and self.queue_poll_s > 0, "timeouts must be positive")
        _require(self.upload_cache_ttl_s >= 60, "upload_cache_ttl_s must be at least 60 s")
        _require(self.address_upload_bytes >= self.max_upload_bytes, "address_upload_bytes must allow one upload")
        _require(self.upload_cache_max_bytes >= self.address_upload_bytes,
                 "upload_cache_max_bytes must allow one address's budget")
        _require(self.address_upload_window_s > 0, "address_upload_window_s must be positive")
        _require(self.malloc_trim_s >= 0, "malloc_trim_s must be >= 0 (0: never)")
        _require(self.tab_states_max >= 1, "tab_states_max must be at least 1")
        _require(self.decode_workers >= 1 and self.address_max_decodes >= 1, "decode limits must be positive")
        _require(self.address_max_events >= 1, "address_max_events must be at least 1")
        _require(self.address_max_waiting_events >= 1, "address_max_waiting_events must be at least 1")
        _require(self.address_max_uploads >= 1, "address_max_uploads must be at least 1")
        _require(self.address_max_connections >= 2, "address_max_connections must allow a tab (at least 2)")
        _require(self.upload_timeout_s > 0, "upload_timeout_s must be positive")
        _require(self.address_max_downloads >= 8, "address_max_downloads must allow a page load (at least 8)")
        _require(self.address_logins >= 1 and self.address_logins_window_s > 0,
                 "address_logins must be at least 1 per positive window")
        _require(self.address_new_sessions >= 1 and self.address_new_sessions_window_s > 0,
                 "address_new_sessions must be at least 1 per positive window")
        _require(self.address_refusals >= 1 and self.address_refusals_window_s > 0,
                 "address_refusals must be at least 1 per positive window")
        _require(self.identity_key == "" or len(self.identity_key) >= 16, "identity_key needs at least 16 characters")
        parse_networks(self.trusted_proxies)  # raises ValueError naming a bad entry
        _require(not self.client_header or self.trusted_proxies,
                 "client_header is believed only from trusted proxies: name them in trusted_proxies too")
        _require(all(c.isalnum() or c == "-" for c in self.client_header),
                 f"client_header must be a header name (letters, digits and '-'), got {self.client_header!r}")
        _require(32 <= self.ipv6_prefix <= 128, "ipv6_prefix must be 32..128 bits")
        _require(self.stream_min_interval_s > 0 and self.stream_min_updates_per_s > 0, "update rates must be positive")
        _require(1 / self.stream_min_interval_s >= self.stream_min_updates_per_s,
                 "stream_min_interval_s must allow stream_min_updates_per_s")
        _require(self.page_max_updates_per_s >= 1 / self.stream_min_interval_s,
                 "page_max_updates_per_s must allow one stream at full speed")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> "UIConfig":
        """Read ``REDIS_URL``, ``OWLET_KEY_PREFIX`` and ``OWLET_UI_<FIELD>``; keyword overrides win."""
        env = os.environ if environ is None else environ
        values: dict = {}
        if env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        if env.get("OWLET_KEY_PREFIX"):
            values["key_prefix"] = env["OWLET_KEY_PREFIX"]
        values.update(read_fields(cls, ENV_PREFIX, env, skip=ENV_SKIP, custom=_CUSTOM))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_overrides(self, **overrides) -> "UIConfig":
        """A copy with the non-None overrides applied (command-line flags win over the environment)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _require(condition: bool, message: str) -> None:
    """A setting's check: a ValueError naming what to change (an assert would vanish under ``python -O``)."""
    if not condition:
        raise ValueError(message)


def root_path_problem(root_path: str) -> str | None:
    """Why ``root_path`` cannot be where the page is served (None when it can): a path from the host's root, like
    "/owlet", or a whole URL, like "https://example.com/owlet"; without a slash at the end, which would double the
    slash in every URL Gradio builds with it."""
    if root_path == "":
        return None
    url = urlsplit(root_path)
    whole = url.scheme in ("http", "https") and url.netloc
    if not (whole or (root_path.startswith("/") and not root_path.startswith("//") and not url.scheme)):
        return (f"root_path {root_path!r} must start with '/' (a path from the host's root, like '/owlet') or be a "
                f"whole http(s) URL")
    if root_path.endswith("/") or url.query or url.fragment or any(c.isspace() for c in root_path):
        return (f"root_path {root_path!r} must be a path without a '/' at its end, a query or spaces, like '/owlet'")
    return None


def _parse_auth_var(name: str, raw: str):
    try:
        return parse_auth(raw)
    except ValueError as exc:
        raise SettingError(f"{name}: {exc}") from None


def _parse_list(name: str, raw: str) -> tuple[str, ...]:
    """A comma-separated list, blanks dropped."""
    return tuple(s.strip() for s in raw.split(",") if s.strip())


def _parse_formats(name: str, raw: str) -> tuple[str, ...]:
    return tuple(s.upper() for s in _parse_list(name, raw))


_CUSTOM = {"auth": _parse_auth_var, "allowed_formats": _parse_formats, "trusted_proxies": _parse_list}
