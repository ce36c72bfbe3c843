"""Attack: a chat that names a file on the server (or a URL) instead of uploading one. Gradio must refuse to
read it before any handler runs, so nothing on the server's disk or network can become someone's "image"."""
from __future__ import annotations

import pytest

from tests.security.attack import assert_can_still_ask, call, http, identity

pytestmark = pytest.mark.timeout(180)

SERVER_FILES = ["/etc/passwd", "models/owlet-shapes-vl/model.safetensors", "../../etc/hostname",
                "/tmp/gradio/../../etc/passwd", "http://127.0.0.1:6379/", "file:///etc/passwd"]


@pytest.mark.parametrize("path", SERVER_FILES)
def test_a_chat_cannot_attach_a_server_file_or_url(quiet_page, path):
    url, owlet = quiet_page
    with http(forwarded="203.0.113.50") as client:
        token = identity(client, url)
        for attached in ({"path": path, "meta": {"_type": "gradio.FileData"}}, path,
                         {"path": None, "url": path, "meta": {"_type": "gradio.FileData"}}):
            with pytest.raises(RuntimeError, match="the page failed the event") as refused:
                call(client, url, "chat", [{"text": "what is this?", "files": [attached]}, 16, token])
            assert "must be uploaded to this page first" in str(refused.value), "the caller is told why"
    assert owlet.queue_stats()["queued"] == 0, "nothing was admitted"
    assert_can_still_ask(url, owlet, token, forwarded="203.0.113.50")
