"""A call may name only files its own client uploaded to this page, or the page's example pictures.

Gradio converts an event's inputs before any handler runs (``Blocks.preprocess_data``), and for a file it takes
whatever ``path`` the client sends. Two things follow that Owlet's handlers come too late to stop:

- **A URL is downloaded.** ``{"path": "https://..."}`` in a ``/chat`` message makes Gradio fetch it into its upload
  cache: whole into memory, with no size limit and a read timeout that each trickled byte resets, before the
  per-address event slot, the upload budget or the image checks see it. A 600 MiB URL takes the page from 1.3 to
  2.3 GB; eight tabs of one address naming a URL that sends a byte every 3 s hold all of Gradio's processing slots,
  and every other visitor's events wait.
- **Another client's upload is readable by path.** Gradio names an upload's folder by its bytes, so a stranger who
  uploads the same picture learns the folder and can name the victim's file in it (``image.png`` for a pasted
  picture): an answer means someone uploaded exactly that picture, "could not be read" that nobody did. Served
  files are closed to other addresses (``ui.uploads.owners``); this closes ``/chat`` too.

So before Gradio converts anything, every file object in a call's inputs must name a local path that an upload
from the caller's address returned (``UploadedPaths``), or one of the example pictures the page itself cached at
start. Anything else (a URL, a data URL, another address's upload, a file the page never handed out, a directory)
is refused with one sentence, the same for every case, so the refusal tells nobody what exists. Nothing is read,
fetched, charged or admitted. A file uploaded before the page restarted must be uploaded again.

A receipt for a refused upload (``ui.uploads.refusal_receipts``, how gradio_client learns why its upload was refused)
is refused here with the upload's own sentence.
"""
from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Iterable, Iterator

import gradio as gr

from ui.gradio_adapters.internals import Patch, replace, require_parameters
from ui.identity import ClientAddresses
from ui.uploads.owners import UploadedPaths
from ui.uploads.refusal_receipts import NOT_UPLOADED, RefusalReceipts

log = logging.getLogger("owlet.ui")

NOT_YOUR_UPLOAD = ("An image must be uploaded to this page first, from your own network (gradio_client's handle_file "
                   "does it; an upload expires after a while or when the page restarts); URLs, names of files on the "
                   "server and other people's uploads are not accepted.")
MAX_NAMED_FILES = 4  # a message holds one picture; a call naming hundreds cost a path lookup and a Gradio
# conversion each (720 of the caller's own upload: 0.2 s of the event loop a request)
MAX_NESTING = 32  # inputs nest a few levels (a message holds a list of files); deeper is not a call the page makes


class NamedFileRefused(gr.Error):
    """Raised before Gradio converts the inputs; a ``gr.Error`` so the caller reads the sentence."""

    def __init__(self):
        super().__init__(NOT_YOUR_UPLOAD, print_exception=False)


class UploadWasRefused(gr.Error):
    """The call names the receipt of an upload the page refused: the refusal's sentence, raised where the caller
    reads it."""

    def __init__(self, sentence: str):
        super().__init__(NOT_UPLOADED.format(sentence=sentence), print_exception=False)


def named_paths(value: Any, depth: int = 0) -> Iterator[Any]:
    """Every ``path`` a file object anywhere in ``value`` names (a ``path`` key at any depth, whatever its type;
    Gradio reads a file from its ``path`` only, its ``url`` is for the browser)."""
    if depth > MAX_NESTING:
        yield None  # refused: no input the page or an API client sends nests this deep
        return
    if isinstance(value, dict):
        if "path" in value:
            yield value["path"]
        for item in value.values():
            yield from named_paths(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from named_paths(item, depth + 1)


def example_files(page: gr.Blocks) -> set[str]:
    """The local files the page's Examples name (Gradio cached them when the page was built)."""
    samples = [block.samples for block in page.blocks.values() if isinstance(block, gr.Dataset)]
    return {os.path.realpath(p) for p in named_paths(samples) if isinstance(p, str) and os.path.isfile(p)}


class NamedFiles:
    """Which paths a caller may name: its address's uploads and the page's own example files."""

    def __init__(self, uploads: UploadedPaths, addresses: ClientAddresses, public_paths: Iterable[str] = (),
                 receipts: RefusalReceipts | None = None):
        self.uploads, self.addresses, self.receipts = uploads, addresses, receipts
        self.public_paths = {os.path.realpath(p) for p in public_paths}

    def may_name(self, address: str, path: Any) -> bool:
        if not isinstance(path, str) or not path or "\x00" in path:
            return False
        if "://" in path or path.lower().startswith(("data:", "//")):
            return False  # Gradio would download it
        if os.path.realpath(path) in self.public_paths:
            return True
        return self.uploads.uploaded_by(address, path)

    def check(self, request, inputs: list) -> None:
        """Raise ``NamedFileRefused`` unless the caller may name every file the inputs name."""
        address = self.addresses.of(request)
        paths = list(itertools.islice(named_paths(inputs), MAX_NAMED_FILES + 1))
        for sentence in map(self.receipts.sentence, paths) if self.receipts is not None else ():
            if sentence:
                raise UploadWasRefused(sentence)
        if len(paths) > MAX_NAMED_FILES or not all(self.may_name(address, path) for path in paths):
            log.debug("refused a file named by %s", address)
            raise NamedFileRefused()


def check_named_files(page: gr.Blocks, files: NamedFiles) -> list[Patch]:
    """Make ``page`` refuse, before converting any input, a call naming a file its caller may not name."""
    process = require_parameters(page, "process_api", ("block_fn", "inputs", "state", "request"))

    async def process_api(block_fn, inputs, state=None, request=None, *args, **kwargs):
        if inputs and not isinstance(request, list):  # Owlet runs no batch events (a list of requests)
            files.check(request, inputs)
        return await process(block_fn, inputs, state, request, *args, **kwargs)

    return [replace(page, "process_api", process_api)]  # the queue and the API routes look it up on the instance
