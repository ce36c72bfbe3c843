"""Where K/V and conv states live between steps and between turns: a request's cache rows (``kv_cache``,
``slot_cache``, ``cache_layers``), conversations' finished turns and shared prefixes (``session_store``,
``prefix_index``) in a byte-budgeted LRU (``byte_lru``), parked off the device as int8/int4 (``kv_quant``), and their
files on disk (``disk_tier``, ``entry_file``)."""
