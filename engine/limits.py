"""Image limits, defined once for every layer. Torch-free: the page, the worker and the engine all read it.

An image passes three gates on its way to the model, and their numbers belong together:

- the page (``ui.uploads.image_check``) refuses files over ``UPLOAD_MAX_BYTES`` or in a format not in
  ``ALLOWED_FORMATS``, refuses headers announcing more than ``DECODE_MAX_PIXELS`` (a decompression bomb) before
  decoding, and downscales what it accepts to ``MAX_SIDE`` on the longest side;
- the worker (``worker.store.images``) stores at most ``UPLOAD_MAX_BYTES`` per image and downscales what it loads to
  ``MAX_SIDE`` again (a client other than the page may have stored it);
- the engine (``engine.prompt``) downscales anything over ``MODEL_MAX_PIXELS`` before preprocessing, because
  vision towers tile big images into thousands of tokens. It equals a ``MAX_SIDE`` square, so an image that
  passed the page arrives unchanged.

A conversation may hold at most ``MAX_IMAGES_PER_REQUEST`` images (every image turn counts, the same picture sent
twice too): the engine refuses more, and the worker counts them before it decodes any, at admission and again
when it runs the job, so a conversation past the limit costs no decodes.

Each layer's settings take these as defaults (``UIConfig``, ``worker.config.Settings``, ``EngineConfig``); a
deployment may still override one layer through its own variable.
"""
from __future__ import annotations

UPLOAD_MAX_BYTES = 10 * 1024 * 1024
ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
DECODE_MAX_PIXELS = 16_000_000  # about 16 MP is plenty for what any model here uses
MAX_SIDE = 1024
MODEL_MAX_PIXELS = MAX_SIDE * MAX_SIDE
MAX_IMAGES_PER_REQUEST = 8
