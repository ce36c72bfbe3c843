"""One file per upload request, of at most the upload limit: Gradio's multipart parser made to refuse more.

Gradio's upload route accepts up to 1,000 files in one request and puts each distinct file in a directory of its
own; the page's uploads carry one picture each (the chat box takes one per message, and ``gradio_client`` uploads
files one request at a time). Why the count matters: ``ui.uploads.cache_dirs``.

The size limit is Owlet's own too, applied here while the file streams in, so a bigger file is refused before it
is written to disk (HTTP 413). Gradio's ``max_file_size`` is not used for it: that setting is also the front end's
own check, which dropped a picture over the limit with a toast and sent the question without it; the page is
launched without one, and its script sends a stand-in for such a picture instead (``ui.page_script``). The parser
is replaced process-wide, so the page built last sets the limit (``owlet-page`` runs one page per process).

Whatever ends a parse early, the parts it wrote go. Gradio deletes them only when the body is malformed: a client gone
mid-upload (``ClientDisconnect``), a full disk (``OSError``) or a cancel left the part received so far in the upload
folder, where no budget counted it and nothing but the cache's hourly cleaner would delete it (a full disk then stayed
full, refusing every picture).
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

from ui.gradio_adapters.internals import NotAdaptable, Patch, replace, require, require_parameters

MAX_FILES_PER_UPLOAD = 1
MAX_FIELDS_PER_UPLOAD = 8  # the upload form has no other fields; a few spare for clients that add some


def limit_files_per_upload(max_file_bytes: int | float = math.inf, max_files: int = MAX_FILES_PER_UPLOAD,
                           max_fields: int = MAX_FIELDS_PER_UPLOAD) -> list[Patch]:
    """Make Gradio's upload route refuse a request with more than ``max_files`` files (HTTP 400, "Too many
    files") or a file over ``max_file_bytes`` (HTTP 413), while it parses: the parts it had already written are
    deleted by Gradio's own error path."""
    from gradio import route_utils

    parser = require(route_utils, "GradioMultiPartParser")
    if (getattr(parser, "owlet_max_files", None), getattr(parser, "owlet_max_file_bytes", None)) == (
            max_files, max_file_bytes):
        return [Patch(route_utils, "GradioMultiPartParser", parser)]
    base = getattr(parser, "owlet_base", parser)  # Gradio's own, under an earlier page's limits
    require_parameters(base, "__init__", ("max_files", "max_fields", "max_file_size"))
    if "GradioMultiPartParser" not in require(route_utils, "upload_fn").__code__.co_names:
        raise NotAdaptable("gradio.route_utils.upload_fn no longer makes its parser from GradioMultiPartParser")
    if "_files_to_close_on_error" not in require(base, "parse").__code__.co_names:
        raise NotAdaptable("GradioMultiPartParser.parse no longer keeps the files it wrote in _files_to_close_on_error")

    class OneUploadParser(base):
        owlet_max_files, owlet_max_file_bytes, owlet_base = max_files, max_file_bytes, base

        def __init__(self, *args, **kwargs):
            kwargs["max_files"] = min(kwargs.get("max_files", max_files), max_files)
            kwargs["max_fields"] = min(kwargs.get("max_fields", max_fields), max_fields)
            kwargs["max_file_size"] = min(kwargs.get("max_file_size", max_file_bytes), max_file_bytes)
            super().__init__(*args, **kwargs)

        async def parse(self):
            try:
                return await super().parse()
            except BaseException:
                for file in self._files_to_close_on_error:  # Gradio's own error path may have deleted them already
                    with contextlib.suppress(OSError):
                        file.close()
                    with contextlib.suppress(OSError):
                        Path(file.name).unlink(missing_ok=True)
                raise

    return [replace(route_utils, "GradioMultiPartParser", OneUploadParser)]  # upload_fn looks it up at each call
