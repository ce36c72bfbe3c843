"""Running the page: starting its server, and what an operator reads of it.

``launch`` starts the server and waits until it answers; ``endpoints`` serves ``/healthz`` and ``/metrics``;
``metrics`` and ``cluster_metrics`` are what ``/metrics`` reports. (``ui.shared.log_budget`` keeps refusals a
stranger can trigger from filling the log.)
"""
