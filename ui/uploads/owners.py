"""An uploaded file is served back only to the address that uploaded it.

Gradio stores each upload at ``<upload dir>/<sha256(install seed + bytes)>/<file name>`` and serves any file there
to anyone at ``/gradio_api/file=<path>``. The folder is a function of the bytes alone, so a stranger who uploads
the same picture learns its folder from the upload's answer, and can then ask for the names a browser gives a
picture (``image.png`` for a pasted one): 200 would mean someone uploaded exactly that picture within the cache's
lifetime, 403 that nobody did. That is the "did anyone upload this picture?" question the image quotas and decode
verdicts do not answer either.

So every path an upload returns is recorded with the uploading client's address, and a request for a recorded
path from any other address gets exactly what Gradio answers for a file that does not exist (403, "File not
allowed: <path>."). Paths no upload returned (the example pictures Gradio caches at start, and uploads from
before a restart) are left to Gradio's own rules. Within one address (people behind one NAT) files stay shared.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses
from ui.shared.route_paths import FILE_PREFIXES, UPLOAD_PATH
from ui.uploads.budget import CHARGE_SCOPE_KEY

MAX_RECORDED_PATHS = 200_000  # about 40 MB; the oldest record goes first (the cache deletes files after an hour)
MAX_UPLOAD_ANSWER_BYTES = 64 * 1024  # an upload answers with one path (ui.uploads.cache_dirs allows one file)


class UploadedPaths:
    """Which client addresses uploaded each path (the newest ``remembered`` paths). Shared by the middleware that
    serves files (``UploadOwners``) and the check of the files a ``/chat`` call names
    (``ui.gradio_adapters.named_files``)."""

    def __init__(self, remembered: int = MAX_RECORDED_PATHS):
        self.remembered = remembered
        self._owners: OrderedDict[str, set[str]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, address: str, path: str) -> None:
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._owners.setdefault(key, set()).add(address)
            self._owners.move_to_end(key)
            while len(self._owners) > self.remembered:
                self._owners.popitem(last=False)

    def forget(self, address: str, path: str) -> None:
        """``address`` no longer holds ``path`` (it gave up its claim to make room: ``ui.uploads.room``)."""
        key = path_key(path)
        with self._lock:
            owners = self._owners.get(key)
            if owners is not None:
                owners.discard(address)
                if not owners:
                    del self._owners[key]

    def owners(self, path: str) -> set[str] | None:
        """The addresses that uploaded ``path``; None when no upload of this page's lifetime returned it."""
        key = path_key(path)
        if key is None:
            return None
        with self._lock:
            owners = self._owners.get(key)
            return set(owners) if owners is not None else None

    def may_read(self, address: str, path: str) -> bool:
        """Served files: a path no upload returned is left to Gradio's own rules."""
        owners = self.owners(path)
        return owners is None or address in owners

    def uploaded_by(self, address: str, path: str) -> bool:
        owners = self.owners(path)
        return owners is not None and address in owners


class UploadOwners:
    """ASGI middleware: records who uploaded each path, and refuses served files to other addresses."""

    def __init__(self, app: ASGIApp, addresses: ClientAddresses = DIRECT, ledger: UploadedPaths | None = None,
                 on_stored=None):
        self.app, self.addresses = app, addresses
        self.ledger = ledger if ledger is not None else UploadedPaths()
        # ``on_stored(address, path, charge)`` for each stored upload charged by ui.uploads.budget
        # (``UploadRoom.claim``)
        self.on_stored = on_stored

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if scope["method"] == "POST" and path == UPLOAD_PATH:
            return await self.app(scope, receive, self._recording(self.addresses.of(Request(scope)), scope, send))
        if scope["method"] in ("GET", "HEAD") and path.startswith(FILE_PREFIXES):
            target = path[len(next(p for p in FILE_PREFIXES if path.startswith(p))):]
            if path_key(target) is None or not self.ledger.may_read(self.addresses.of(Request(scope)), target):
                # Word for word what Gradio answers for a path that is not there (gradio.route_utils.file_fetch).
                return await JSONResponse({"detail": f"File not allowed: {target}."}, status_code=403)(
                    scope, receive, send)
        await self.app(scope, receive, send)

    def _recording(self, address: str, scope: Scope, send: Send) -> Send:
        """``send`` that also reads the upload's answer (a JSON list of stored paths) and records them."""
        status, body = 0, bytearray()

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status == 200:
                if len(body) <= MAX_UPLOAD_ANSWER_BYTES:
                    body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    self._record_answer(address, bytes(body), scope.get(CHARGE_SCOPE_KEY))
            await send(message)
        return recording_send

    def _record_answer(self, address: str, body: bytes, charge) -> None:
        try:
            paths = json.loads(body)
        except ValueError:
            return
        paths = [path for path in paths if isinstance(path, str)] if isinstance(paths, list) else []
        for path in paths:
            self.ledger.record(address, path)
        if len(paths) == 1 and charge is not None and self.on_stored is not None:  # one file per upload
            self.on_stored(address, paths[0], charge)


def path_key(path: str) -> str | None:
    """One spelling per file: how Gradio would resolve it (``..``, doubled slashes and links undone); None for
    a path no file can have (a NUL byte, which ``realpath`` refuses with ValueError)."""
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):
        return None
