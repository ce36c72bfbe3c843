"""An uploaded file is served back only to the address that uploaded it (ui.uploads.owners).

Gradio's upload folder is named by the bytes alone, so a stranger who uploaded the same picture learnt its folder
and could ask for the victim's file name there: 200 said someone had uploaded that exact picture, 403 that nobody
had."""
from __future__ import annotations

import pytest

from tests.security.attack import http, uploaded_by_both

pytestmark = pytest.mark.timeout(120)

VICTIM, STRANGER = "198.51.100.7", "203.0.113.9"


def fetch(url: str, address: str, path: str, method: str = "GET"):
    with http(forwarded=address) as client:
        return client.request(method, f"{url}gradio_api/file={path}")


def test_a_stranger_cannot_tell_whether_a_picture_was_uploaded(quiet_page):
    url, _owlet = quiet_page
    data, victims, probe, folder = uploaded_by_both(url, VICTIM, STRANGER, "zz-probe.png")
    never_uploaded = f"{folder}/photo.png"
    for method in ("GET", "HEAD"):
        taken, missing = fetch(url, STRANGER, victims, method), fetch(url, STRANGER, never_uploaded, method)
        assert taken.status_code == missing.status_code == 403, (method, taken.status_code, missing.status_code)
        assert taken.text.replace(victims, "X") == missing.text.replace(never_uploaded, "X"), "told apart by the body"
    assert fetch(url, VICTIM, victims).content == data, "the uploader still sees its own picture"
    assert fetch(url, STRANGER, probe).content == data, "and so does the stranger, its own copy"
    spelled_otherwise = victims.replace(folder, folder + "/../" + folder.rsplit("/", 1)[1])
    assert fetch(url, STRANGER, spelled_otherwise).status_code == 403, "another spelling of the same path"


def test_a_path_no_file_can_have_is_refused_not_a_server_error(quiet_page):
    """``os.path.realpath`` refuses a NUL byte with ValueError: the page answered 500 and logged a traceback."""
    url, _owlet = quiet_page
    for target in ("%00", "/tmp/gradio/a%00b.png"):
        with http(forwarded=STRANGER) as client:
            response = client.get(f"{url}gradio_api/file={target}")
        assert response.status_code == 403 and "File not allowed" in response.text, (target, response.text[:200])
