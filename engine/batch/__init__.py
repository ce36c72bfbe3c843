"""The decode batches and how a step's rows run: the ``DecodeBatch`` protocol and which batch a family gets
(``decode_batch``), a concatenated ``DynamicCache`` (``dynamic_batch``) or preallocated per-row slots
(``slot_batch``), batched prefill (``prefill_batch``), captured decode steps on CUDA (``cuda_graphs``) and varlen
decode attention (``varlen_attention``)."""
