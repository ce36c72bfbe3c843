"""The conversation a visitor has: the Gradio handlers and what they call.

``handlers`` wires the parts and hands Gradio their events. ``asking`` submits a new, retried or edited turn;
``streaming`` follows its job (``job_follower``) through one reader of every answer stream (``stream_hub``), at a
pace the page can afford (``pacing``); ``tab_session`` loads the page, resumes an answer after a reload, stops it
and starts a new conversation. Before any of it, ``event_guard`` checks who asks and holds the address's event
slot; ``turn_errors`` says what refused a turn, ``page_reads`` reads a tab's chat and jobs without raising,
``tab_state`` and ``input_box`` are the tab's state and box, ``view`` turns the stored history into Chatbot
messages, and ``live_streams`` records whose answer streams in which tab. Every sentence is in ``ui.shared.wording``.
"""
