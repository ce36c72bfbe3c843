"""How much a client group's recent use of the workers sets it back when it starts waiting again.

The queue's scripts (``worker/queue/lua``) get these values through the prelude ``worker.queue.scripts`` writes
for them; the page's fair share of Gradio's event slots (``ui.gradio_adapters.fair_event_slots``) uses the same
ones, so a client is set back alike in both lines.
"""

# How long a group's past use of the workers counts against it when it waits again: its jobs' seconds in flight,
# halved every this many seconds. A client whose answer just ended is not a newcomer (see join_ring in common.lua).
GROUP_USAGE_HALF_LIFE_S = 120
# How far a group's usage sets it back when it starts waiting: GROUP_USAGE_WEIGHT seconds per (decayed) second in
# flight, at most GROUP_USAGE_CAP_S or, when groups have been waiting longer than that, at most the longest of their
# waits. With a fixed bound alone, a crowd whose waits outgrew it would stay ahead of every newcomer (100 addresses
# looping long answers kept a visitor at position 36); with no bound, a user who had chatted a lot would wait behind
# a stream of lighter clients re-asking. Bounded by the line, a heavy user queues at worst like the group that has
# waited longest now, and a newcomer goes ahead of every group that used the workers lately.
GROUP_USAGE_WEIGHT = 4
GROUP_USAGE_CAP_S = 30
# The one shared queue (and client group) of FIFO mode (``Settings.fifo``, the benchmarks' baseline): every question
# waits in it, in arrival order.
FIFO_QUEUE = "*fifo*"
