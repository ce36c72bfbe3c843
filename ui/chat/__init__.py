"""The conversation a visitor has: the Gradio handlers and what they call.

``handlers`` (thin: a few calls into the worker client each) submits a turn and follows its job
(``job_follower``) through one reader of every answer stream (``stream_hub``), at a pace the page can afford
(``pacing``); ``view`` turns the stored history into Chatbot messages, ``live_streams`` records whose answer
streams in which tab, and ``wording`` holds every sentence the page shows about a turn.
"""
