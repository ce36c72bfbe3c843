"""What the worker and the page keep in Redis, one module per kind of record: key names and fields (``keys``), jobs
and their payloads (``jobs``), answer streams and their reader (``streams``, ``stream_reader``), conversations'
histories and the budget they share (``history``, ``history_budget``, ``memory_model``), the index of stateless
clients' conversations (``conversation_index``), and pictures (``images``, ``image_structure``).

The queue's scripts (``worker.queue``) change these records; these modules read and write them."""
