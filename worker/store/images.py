"""Image bytes stored once in Redis under their sha256, with a TTL. Jobs carry only the hash."""
from __future__ import annotations

import hashlib
import io
import re

import redis
from PIL import Image, UnidentifiedImageError

from engine.limits import ALLOWED_FORMATS
from worker.errors import ImageMissing, InvalidInput
from worker.store.image_structure import structure_problem
from worker.store.keys import Keys

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class ImageStore:
    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int, max_bytes: int):
        self.r, self.keys, self.ttl_s, self.max_bytes = r, keys, ttl_s, max_bytes

    def put(self, data: bytes) -> str:
        """Validate and store ``data``; returns its sha256. Storing the same bytes twice only refreshes the TTL.

        The page does not use this: it stores an image only as part of an admitted turn (``JobStates.enqueue``).
        """
        sha = self.check(data)
        key = self.keys.image(sha)
        if not self.r.set(key, bytes(data), ex=self.ttl_s, nx=True):
            self.r.expire(key, self.ttl_s)
        return sha

    def check(self, data: bytes) -> str:
        """Validate ``data`` as an image Owlet can store (size, header) without storing it; returns its sha256."""
        if not isinstance(data, (bytes, bytearray)) or not data:
            raise InvalidInput("The upload is empty. Please choose an image file.")
        if len(data) > self.max_bytes:
            raise InvalidInput(f"The image is too large ({len(data) // 1024} KiB); the limit is "
                               f"{self.max_bytes // 1024} KiB.")
        problem = structure_problem(data)
        if problem:
            raise InvalidInput(problem)
        try:
            with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
                img.verify()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise InvalidInput("The file is not an image Owlet can read (use PNG, JPEG or WebP).") from exc
        return hashlib.sha256(data).hexdigest()

    def exists(self, sha: str) -> bool:
        return isinstance(sha, str) and bool(SHA256_RE.match(sha)) and bool(self.r.exists(self.keys.image(sha)))

    def touch(self, sha: str) -> None:
        """Refresh the TTL of an image a new turn refers to, so it outlives the job."""
        self.r.expire(self.keys.image(sha), self.ttl_s)

    def load(self, sha: str, max_side: int) -> Image.Image:
        """Return the image as RGB, downscaled to ``max_side``; raises ImageMissing or InvalidInput."""
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise InvalidInput(f"Invalid image reference {sha!r}.")
        data = self.r.get(self.keys.image(sha))
        if data is None:
            raise ImageMissing()
        problem = structure_problem(data)  # the page refuses these at upload; bytes may reach Redis some other way
        if problem:
            raise InvalidInput(problem)
        try:
            img = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)  # no other parser sees the bytes
            if img.format == "JPEG":
                img.draft("RGB", (max_side, max_side))  # decode at a reduced scale: no full-size pixels
            img = img.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise InvalidInput("The stored image could not be decoded. Please upload it again.") from exc
        img.thumbnail((max_side, max_side))
        return img
