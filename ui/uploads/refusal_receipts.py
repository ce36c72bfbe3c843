"""A refused upload, told to gradio_client in a form it reads.

gradio_client uploads a call's files before it sends the call, and an upload answered with an error status raises
httpx's ``HTTPStatusError``, whose message names the status and the URL but not one word of the response: a visitor
whose picture a per-address limit refused learnt nothing of why, nor when to try again. Browsers and raw HTTP clients
read the refusal as it is (its status, ``Retry-After`` and sentence), and keep getting it that way.

For gradio_client's uploads (it names itself in ``User-Agent``) a refusal for a limit (413, 429, 503) is answered 200
with a receipt where the stored file's path would be: ``owlet-upload-refused/<the sentence, base64>.<signature>``.
gradio_client puts that path in its call, and the check of the files a call names (``ui.gradio_adapters.named_files``)
refuses the call with the sentence, which gradio_client raises as its ``AppError``. Nothing is stored or charged for a
receipt, and a client that claims to be gradio_client gets the same refusal in another form. The signature (a key
of this page process) keeps a caller from making the page say words it never said.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.shared.route_paths import UPLOAD_PATH

PREFIX = "owlet-upload-refused/"
LIMIT_STATUSES = (413, 429, 503)  # refusals for a limit; a login wall or a malformed upload stays as it is
MAX_SENTENCE_BYTES = 1024
CLIENT_NAME = b"gradio_client/"  # how gradio_client starts its User-Agent
NOT_UPLOADED = "Your picture was not uploaded: {sentence}"


class RefusalReceipts:
    """Signs a refusal's sentence into a receipt, and reads one back."""

    def __init__(self, key: bytes | None = None):
        self._key = key or secrets.token_bytes(32)

    def receipt(self, sentence: str) -> str:
        text = base64.urlsafe_b64encode(sentence.encode()[:MAX_SENTENCE_BYTES]).decode()
        return f"{PREFIX}{text}.{self._sign(text)}"

    def sentence(self, path: object) -> str | None:
        """The sentence a receipt this page made carries; None for any other path."""
        if not isinstance(path, str) or not path.startswith(PREFIX) or len(path) > 4 * MAX_SENTENCE_BYTES:
            return None
        text, _, signature = path[len(PREFIX):].rpartition(".")
        if not signature.isascii() or not hmac.compare_digest(signature, self._sign(text)):
            return None
        try:
            return base64.urlsafe_b64decode(text).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None

    def _sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()[:32]


def from_gradio_client(scope: Scope) -> bool:
    return any(name == b"user-agent" and value.startswith(CLIENT_NAME) for name, value in scope.get("headers", ()))


class UploadRefusalReceipts:
    """ASGI middleware: a gradio_client upload refused for a limit gets a receipt instead of the error response."""

    def __init__(self, app: ASGIApp, receipts: RefusalReceipts):
        self.app, self.receipts = app, receipts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != UPLOAD_PATH \
                or not from_gradio_client(scope):
            return await self.app(scope, receive, send)
        held: Message | None = None  # a refusal's response start, held until its sentence is in
        body = b""

        async def receipt_send(message: Message) -> None:
            nonlocal held, body
            if held is None:
                if message["type"] == "http.response.start" and message["status"] in LIMIT_STATUSES:
                    held = message
                    return None
                return await send(message)
            body += message.get("body", b"")
            if not message.get("more_body", False):
                await self._send_receipt(send, body.decode("utf-8", "replace").strip())
        await self.app(scope, receive, receipt_send)

    async def _send_receipt(self, send: Send, sentence: str) -> None:
        answer = json.dumps([self.receipts.receipt(sentence or "the page refused it; try again later.")]).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer, "more_body": False})
