"""The page's lowest layer: what several of its groups use, importing none of them.

Every sentence the page shows (``wording``), the edge's refusals in one shape (``refusals``), per-address slots
(``address_slots``), the OpenAI error object (``openai_errors``), the route paths several groups name (``route_paths``)
and the budget on repeated log lines (``log_budget``). docs/design.md, "The page's layers", draws the rest.
"""
