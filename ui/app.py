"""The page layout and its event wiring (``build_page``); the handlers live in ``ui.handlers``.

Every streaming event sets ``concurrency_limit=None``: Gradio's default of 1 would serialise all users
behind one answer. They also set ``postprocess=False``: their handlers yield values already in wire format
(``ui.chat_view``), so Gradio does not re-validate the whole conversation on every streamed update.
The only caps are ``launch(max_threads=...)`` and ``queue(max_size=...)``, set in ``ui.server`` from the
config.
"""
import gradio as gr

from ui.handlers import ChatHandlers, new_session

TITLE = "Owlet — chat about an image"
INTRO = ("Attach an image with 📎 (or drop it in), ask a question, and keep asking follow-ups about it. "
         "Attach another image at any time to switch pictures.")
CSS = """
#owlet-status { min-height: 1.6em; opacity: 0.8; font-size: 0.9em; }
#owlet-header h1 { margin-bottom: 0; }
footer { display: none !important; }
"""
BROWSER_ID_KEY = "owlet-browser-id"
CONVERSATION_KEY = "owlet-conversation"


def build_page(handlers: ChatHandlers, config) -> gr.Blocks:
    """Build the Blocks for one app; nothing runs until it is launched."""
    with gr.Blocks(title="Owlet", fill_height=True) as page:
        browser_id = gr.BrowserState(None, storage_key=BROWSER_ID_KEY, secret=config.secret)
        last_conversation = gr.BrowserState(None, storage_key=CONVERSATION_KEY, secret=config.secret)
        session = gr.State(new_session())
        with gr.Row(elem_id="owlet-header"):
            gr.Markdown(f"# 🦉 {TITLE}\n{INTRO}")
        chatbot = gr.Chatbot(elem_id="owlet-chat", height="66vh", min_height=360, editable="user", show_label=False,
                             buttons=["copy"], feedback_options=None, placeholder="Ask about an image…",
                             autoscroll=True)
        box = gr.MultimodalTextbox(elem_id="owlet-input", file_types=["image"], file_count="single",
                                   placeholder="Ask about the image… (attach one with 📎)", show_label=False,
                                   submit_btn=True, stop_btn=False, autofocus=True, max_plain_text_length=4000)
        with gr.Row():
            status = gr.Markdown("", elem_id="owlet-status")
            new_chat = gr.Button("🆕 New conversation", elem_id="owlet-new", size="sm", scale=0, min_width=200)
        with gr.Accordion("Settings", open=False, elem_id="owlet-settings"):
            answer_length = gr.Slider(1, config.max_new_tokens_cap, value=config.max_new_tokens, step=1,
                                      label="Longest answer (tokens)", elem_id="owlet-answer-length")

        streamed = [box, chatbot, status, session]
        chat_event = box.submit(handlers.respond, [box, answer_length, session, browser_id], streamed,
                                api_name="chat", concurrency_limit=None, show_progress="hidden",
                                postprocess=False)
        retry_event = chatbot.retry(handlers.retry, [answer_length, session, browser_id], streamed,
                                    api_name="retry", concurrency_limit=None, show_progress="hidden",
                                    postprocess=False)
        edit_event = chatbot.edit(handlers.edit, [answer_length, session, browser_id], streamed,
                                  api_name="edit", concurrency_limit=None, show_progress="hidden",
                                  postprocess=False)
        answering = [chat_event, retry_event, edit_event]
        box.stop(handlers.stop, [session, browser_id], [box, status, session], cancels=answering,
                 api_name="stop", queue=False)
        fresh = [box, chatbot, status, session]
        new_event = new_chat.click(handlers.new_conversation, [session, browser_id], fresh, cancels=answering,
                                   api_name="new_conversation", queue=False)
        # The Chatbot's own trash button clears the view: start a new conversation too, so the stored
        # history never disagrees with what is shown.
        clear_event = chatbot.clear(handlers.new_conversation, [session, browser_id], fresh, cancels=answering,
                                    api_visibility="private", queue=False)
        # Remember the conversation in the browser after every change, so a reload reopens it.
        for event in (*answering, new_event, clear_event):
            event.then(handlers.remember_conversation, [session], [last_conversation], queue=False,
                       api_visibility="private")
        page.load(handlers.on_load, [browser_id, last_conversation], [browser_id, chatbot, status, session],
                  api_visibility="private")
    return page
