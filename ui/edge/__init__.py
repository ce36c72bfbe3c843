"""The page's edge: what a request meets before Gradio, or a handler, spends anything on it.

ASGI middlewares, stacked in ``ui.server`` outermost first: refusals of API requests as OpenAI error objects
(``api_errors``), gradio_client's refused uploads as receipts (``ui.uploads.refusal_receipts``), the count of each
address's refusals and the brake past it (``refusal_brake``), routes the page does not use (``public_routes``),
oversized bodies (``body_limits``), connections held open (``held_connections``), sign-ins (``logins``), upload
budgets and served files (``ui.uploads``), new tabs per address (``tab_budget``), routes that act on a whole tab
(``tab_guard``), and what Gradio raises on a client's input (``request_errors``). Also the pieces they share:
one shape for a refusal, with its limit's code (``refusals``), a request body read once (``request_body``), per-address slots (``address_slots``), and uvicorn's protocol with a
deadline for request headers (``header_deadline``).
"""
