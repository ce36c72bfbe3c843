"""The page's edge: what a request meets before Gradio, or a handler, spends anything on it.

ASGI middlewares, stacked in ``ui.server`` outermost first: refusals of API requests as OpenAI error objects
(``api_refusals``), gradio_client's refused uploads as receipts (``ui.uploads.refusal_receipts``), the count of each
address's refusals and the brake past it (``refusal_brake``), routes the page does not use (``public_routes``),
oversized bodies (``body_limits``), connections held open (``held_connections``), sign-ins (``logins``), upload
budgets and served files (``ui.uploads``), new tabs per address (``tab_budget``), routes that act on a whole tab
(``tab_guard``), and what Gradio raises on a client's input (``request_errors``). Also a request body read once
(``request_body``) and uvicorn's protocol with a deadline for request headers (``header_deadline``). The pieces they
share with the rest of the page (one shape for a refusal, per-address slots, route paths) are in ``ui.shared``.
"""
