"""Where Owlet reads or replaces Gradio's internals, each adaptation declared and checked in one registry.

``registry`` lists every adaptation, what of Gradio it touches and the defence it carries, and refuses to start the
page on a Gradio it does not fit (``OWLET_UI_ALLOW_UNVERIFIED_GRADIO`` overrides, loudly). ``internals`` is the
only module that names Gradio's private attributes. The adapters: ``fair_event_slots`` (who gets a free event
slot), ``tab_queues`` and ``tab_states`` (new tabs cannot push out open ones), ``tab_config`` (a tab's config does
not grow), ``named_files`` and ``malformed_inputs`` (checks before Gradio converts a call's inputs),
``upload_parser`` (one file per upload), ``event_costs`` (fixed costs taken out of every event).
"""
