"""Close connections whose request headers do not arrive in time.

uvicorn (which Gradio starts) times out an idle keep-alive connection, but nothing else before a request reaches
the application: a connection that sends no bytes, or trickles its headers one byte at a time, stays open for
ever (checked: still open after 12 s, and nothing in the page sees it, so no per-address limit counts it). A few
thousand of them from one machine would use up the page's file descriptors, and nobody could connect.

So the page's HTTP protocol gives every request ``HEADER_TIMEOUT_S`` from its first byte (or from the connection
opening) to finish its headers, and closes the connection otherwise. Bodies have their own deadline in the page
(``ui.edge.held_connections``). This wraps uvicorn's httptools protocol, the one its "auto" setting picks when
``httptools`` is installed (it is a dependency of ``uvicorn[standard]``, which Owlet installs); without it, nothing
changes and the proxy in front must do this (docs/security.md, "What you must still put in front of it").
"""
from __future__ import annotations

import logging

log = logging.getLogger("owlet.ui")

HEADER_TIMEOUT_S = 15.0  # headers are a few hundred bytes: one packet from any client that means it


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: install() says so and changes nothing
    HttpToolsProtocol = None


def install() -> bool:
    """Make uvicorn's "auto" HTTP protocol the deadline-keeping one; False if httptools is not available."""
    if HttpToolsProtocol is None:
        log.warning("httptools is not installed: slow request headers are not timed out (use a proxy in front)")
        return False
    from uvicorn import config

    config.HTTP_PROTOCOLS["auto"] = f"{__name__}:HeaderDeadlineProtocol"
    return True


if HttpToolsProtocol is not None:
    class HeaderDeadlineProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, closing a connection whose request headers take over HEADER_TIMEOUT_S."""

        _header_deadline = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            super().on_headers_complete()

        def connection_lost(self, exc) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self._header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_too_slow)

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()
