"""The paths of the routes several groups of the page name: the upload route, served files, and the
OpenAI-compatible API's routes (``ui.api``). Which routes answer at all is ``ui.edge.public_routes``'s allow-list."""
from __future__ import annotations

# The OpenAI-compatible API (ui.api): its routes, each opened by name.
API_PREFIX = "/v1/"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
KEY_PATH = "/v1/key"
API_PATHS = frozenset({CHAT_COMPLETIONS_PATH, MODELS_PATH, KEY_PATH})

FILE_PREFIXES = ("/gradio_api/file=", "/gradio_api/file/")
UPLOAD_PATH = "/gradio_api/upload"
