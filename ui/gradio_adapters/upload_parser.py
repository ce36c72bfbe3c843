"""One file per upload request: Gradio's multipart parser made to refuse more.

Gradio's upload route accepts up to 1,000 files in one request and puts each distinct file in a directory of its
own; the page's uploads carry one picture each (the chat box takes one per message, and ``gradio_client`` uploads
files one request at a time). Why the count matters: ``ui.uploads.cache_dirs``.
"""
from __future__ import annotations

from ui.gradio_adapters.internals import NotAdaptable, Patch, replace, require, require_parameters

MAX_FILES_PER_UPLOAD = 1
MAX_FIELDS_PER_UPLOAD = 8  # the upload form has no other fields; a few spare for clients that add some


def limit_files_per_upload(max_files: int = MAX_FILES_PER_UPLOAD,
                           max_fields: int = MAX_FIELDS_PER_UPLOAD) -> list[Patch]:
    """Make Gradio's upload route refuse a request with more than ``max_files`` files (HTTP 400, "Too many
    files"), while it parses: the parts it had already written are deleted by Gradio's own error path."""
    from gradio import route_utils

    parser = require(route_utils, "GradioMultiPartParser")
    if getattr(parser, "owlet_max_files", None) == max_files:
        return [Patch(route_utils, "GradioMultiPartParser", parser)]
    require_parameters(parser, "__init__", ("max_files", "max_fields"))
    if "GradioMultiPartParser" not in require(route_utils, "upload_fn").__code__.co_names:
        raise NotAdaptable("gradio.route_utils.upload_fn no longer makes its parser from GradioMultiPartParser")
    base = getattr(parser, "owlet_base", parser)

    class OneUploadParser(base):
        owlet_max_files, owlet_base = max_files, base

        def __init__(self, *args, **kwargs):
            kwargs["max_files"] = min(kwargs.get("max_files", max_files), max_files)
            kwargs["max_fields"] = min(kwargs.get("max_fields", max_fields), max_fields)
            super().__init__(*args, **kwargs)

    return [replace(route_utils, "GradioMultiPartParser", OneUploadParser)]  # upload_fn looks it up at each call
