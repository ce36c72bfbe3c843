"""Start the page's server and wait, patiently, until it answers.

Gradio's ``launch()`` ends by asking the new server for its front page (``networking.url_ok``). One slow answer
(over 3 s, easy on a busy 2-core machine) or one refused connection and it raises "When localhost is not
accessible, a shareable link must be created": the page process dies although its server was fine.

So Owlet skips that check and runs its own: retried until a deadline, and when the page truly never answers,
the error says where it looked and what to check.

Gradio also calls its own server during ``launch()`` through whatever HTTP proxy the environment names
(``HTTP_PROXY``, common on corporate machines), and a proxy cannot reach this machine's loopback: the page died
with "Couldn't start the app". Loopback addresses are therefore added to ``NO_PROXY`` before launching.

Gradio starts uvicorn with uvicorn's defaults, and those trust ``X-Forwarded-For`` from loopback peers
(``FORWARDED_ALLOW_IPS`` = 127.0.0.1 and ::1): for such a peer uvicorn replaces the client address with whatever
the header names, before any of Owlet's code runs. Behind a TLS terminator in TCP mode, an SSH or socat tunnel or
a share server that passes the header on, every per-address limit could then be escaped with one forged header,
and ``OWLET_UI_TRUSTED_PROXIES`` (which reads the header only from proxies the operator names,
``ui.identity.ClientAddresses``) never saw the real peer. So uvicorn trusts no proxy here: the page's one setting
for proxies is Owlet's. Its HTTP protocol is also made to close connections whose headers do not arrive in time
(``ui.edge.header_deadline``).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import time

import httpx

from ui.edge import header_deadline
from ui.gradio_adapters.internals import SKIP_URL_CHECK, check_launch_flag
from ui.gradio_adapters.registry import (LAUNCH_WITHOUT_URL_CHECK, OPEN_TABS_KEEP_STATE, GradioNotVerified,
                                         adaptations_of)
from ui.gradio_adapters.tab_states import keep_open_tabs_states

log = logging.getLogger("owlet.ui")

# What Gradio itself accepts as "the page is served": 401/30x are a login in front of it.
SERVED = (200, 301, 302, 303, 307, 308, 401)
READY_TIMEOUT_S = 60.0


class PageNotServed(RuntimeError):
    """The page cannot be served: its port or address is not available, or its front page never answered."""


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def keep_loopback_off_proxies(environ=os.environ) -> None:
    """Add loopback hosts to ``NO_PROXY``/``no_proxy`` (both spellings are read by httpx and requests)."""
    for name in ("NO_PROXY", "no_proxy"):
        present = [host.strip() for host in environ.get(name, "").split(",") if host.strip()]
        missing = [host for host in LOOPBACK if host not in present]
        if missing:
            environ[name] = ",".join(present + missing)


def ignore_uvicorn_proxy_headers(environ=os.environ) -> None:
    """Make the uvicorn that Gradio starts keep the socket peer as the client address (see the module notes).
    An operator's own ``FORWARDED_ALLOW_IPS`` is overridden, with a note: ``OWLET_UI_TRUSTED_PROXIES`` is the
    setting that names proxies."""
    before = environ.get("FORWARDED_ALLOW_IPS")
    if before:
        print(f"Owlet UI: note: FORWARDED_ALLOW_IPS={before!r} is ignored; name trusted proxies with "
              "OWLET_UI_TRUSTED_PROXIES instead.", flush=True)
    environ["FORWARDED_ALLOW_IPS"] = ""  # matches no peer: uvicorn rewrites nothing


def local_probe_url(page) -> str:
    """``page.local_url`` names ``localhost`` when the page listens on every interface; ask 127.0.0.1 directly."""
    return page.local_url.replace("://localhost:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


def wait_until_served(url: str, timeout_s: float = READY_TIMEOUT_S, verify: bool = True) -> float:
    """Poll ``HEAD url`` until it answers with a served status; return the seconds it took.

    Raises ``PageNotServed`` with the last thing seen once ``timeout_s`` has passed.
    """
    start = time.monotonic()
    last = "no answer yet"
    with httpx.Client(trust_env=False, verify=verify, timeout=min(10.0, timeout_s)) as http:
        while True:
            try:
                status = http.head(url).status_code
                if status in SERVED:
                    return time.monotonic() - start
                last = f"HTTP {status}"
            except httpx.HTTPError as error:
                last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            if time.monotonic() - start >= timeout_s:
                raise PageNotServed(f"the page was started but {url} did not answer within "
                                    f"{timeout_s:.0f} s (last: {last}). Check that nothing else holds the port "
                                    "and that the machine is not out of memory or CPU.")
            time.sleep(0.25)


def launch_page(page, launch_kwargs: dict, ready_timeout_s: float = READY_TIMEOUT_S) -> float:
    """``page.launch`` without Gradio's one-shot localhost check, then Owlet's patient one.

    Returns the seconds the page took to answer. The adaptations of Gradio made at launch go through the page's
    registry (``ui.gradio_adapters.registry``): one that does not apply raises ``GradioNotVerified`` (unless
    unverified Gradio is allowed), before the launch or with the server closed again. On ``PageNotServed`` the
    server is closed before raising, so the port is free again.
    """
    keep_loopback_off_proxies()
    ignore_uvicorn_proxy_headers()
    header_deadline.install()
    adaptations = adaptations_of(page)
    kwargs = dict(launch_kwargs, prevent_thread_lock=True)
    if adaptations.apply(LAUNCH_WITHOUT_URL_CHECK, check_launch_flag, page):
        kwargs.update(SKIP_URL_CHECK)
    adaptations.settle()
    said = io.StringIO()
    try:
        # Gradio prints what happened to a share link itself, instructions to download its tunnel program included:
        # that goes to the debug log, and the page says in one sentence whether it has a link (ui.server).
        with contextlib.redirect_stdout(said):
            page.launch(**kwargs)
    except OSError as exc:  # Gradio's "Cannot find empty port", or an address this host does not have
        where = f"{launch_kwargs.get('server_name')}:{launch_kwargs.get('server_port')}"
        raise PageNotServed(f"cannot serve the page on {where}: that port is in use, or the address is not "
                            "this machine's. Choose another with --port (OWLET_UI_PORT) or --host (OWLET_UI_HOST). "
                            f"({exc})") from exc
    finally:
        for line in said.getvalue().splitlines():
            if line.strip():
                log.debug("Gradio, launching: %s", line)
    try:
        adaptations.apply(OPEN_TABS_KEEP_STATE, keep_open_tabs_states, page)  # the state holder exists now
        adaptations.settle(final=True)
        return wait_until_served(local_probe_url(page), ready_timeout_s,
                                 verify=launch_kwargs.get("ssl_verify", True))
    except (PageNotServed, GradioNotVerified):
        page.close()
        raise
