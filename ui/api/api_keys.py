"""API keys: who an API request is, decided by the server, as for the page (``ui.identity``).

A key is sent as ``Authorization: Bearer <key>`` and is an identity only this server can make and verify:

- without ``--auth``, the anonymous identity token a browser keeps (``v1.<random>.<signature>``): ``GET /v1/key``
  gives a fresh one, and the page's ``/identity`` endpoint gives the same kind. Its group is the client's address,
  so many keys from one address are one client for fairness and every per-address cap;
- with ``--auth``, a login's key (``l1.<login>.<signature>``), which ``GET /v1/key`` gives to a browser (or cookie
  jar) signed in to the page as that login. It names the login, whose group it is, and stops working when the login
  is removed from ``--auth`` or the identity key changes. Anonymous keys are refused then.

A key that does not verify gets 401 before anything is read or stored.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from ui.api.errors import ApiError
from ui.edge.logins import signed_in_login
from ui.identity import Caller, ClientAddresses, IdentityIssuer, anonymous_caller, login_caller

INVALID_KEY = ("The API key is missing or not valid. Send it as 'Authorization: Bearer <key>'; get one from "
               "GET /v1/key (see the README).")
LOGIN_KEY_NEEDED = ("This server requires a login. Sign in to the page, then open /v1/key in the same browser (or "
                    "with its cookie) to get your key.")


CROSS_ORIGIN = "A login's key is given only to the page itself: open /v1/key in a tab signed in to this page."


def same_origin(request) -> bool:
    """Whether a request names no ``Origin`` (a tab, curl, a script) or the host it was sent to."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()


def bearer(request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


class ApiKeys:
    def __init__(self, issuer: IdentityIssuer, addresses: ClientAddresses, logins: tuple[str, ...] = ()):
        self.issuer, self.addresses, self.logins = issuer, addresses, frozenset(logins)

    def caller(self, request) -> Caller:
        """The caller a request's key names; raises ``ApiError`` 401 for a key that does not verify."""
        key = bearer(request)
        address = self.addresses.of(request)
        if self.logins:
            login = self.issuer.verify_login_key(key)
            if login is None or login not in self.logins:
                raise ApiError(401, LOGIN_KEY_NEEDED if key is None else INVALID_KEY, "invalid_api_key")
            return login_caller(login, address)
        ident = self.issuer.verify(key)
        if ident is None:
            raise ApiError(401, INVALID_KEY, "invalid_api_key")
        return anonymous_caller(ident, address)

    def issue(self, request) -> dict:
        """``GET /v1/key``: the signed-in login's key (with ``--auth``), else an anonymous one (the caller's own
        when it sent a valid one). A login's key is given only to a request from the page's own origin (or none,
        as when it is opened in a tab): Gradio lets any site read its responses with the visitor's cookies, so a page
        elsewhere could otherwise fetch a signed-in visitor's key."""
        if self.logins:
            if not same_origin(request):
                raise ApiError(403, CROSS_ORIGIN, "cross_origin")
            login = signed_in_login(request.scope)
            if login is None or login not in self.logins:
                raise ApiError(401, LOGIN_KEY_NEEDED, "login_required")
            return {"key": self.issuer.login_key(login), "login": login}
        return {"key": self.issuer.ensure(bearer(request)), "login": None}
