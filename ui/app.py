"""The page layout and its event wiring (``build_page``); the handlers live in ``ui.chat.handlers``.

Every streaming event sets ``concurrency_limit=None``: Gradio's default of 1 would serialise all users
behind one answer. They also set ``postprocess=False``: their handlers yield values already in wire format
(``ui.chat.view``), so Gradio does not re-validate the whole conversation on every streamed update.
The only caps are ``launch(max_threads=...)`` and ``queue(max_size=...)``, set in ``ui.server`` from the
config.
"""
import json
from pathlib import Path

import gradio as gr

from ui.chat.handlers import ChatHandlers
from ui.chat.tab_state import new_tab_state
from ui.page_script import show_sent_question

TITLE = "Owlet — chat about an image"
# The first view's instructions: two lines at most, on a phone too (tests/ui/test_first_view.py).
HOW_TO_START = ('Attach a picture <span class="owlet-icon owlet-clip" role="img" aria-label="(the paperclip)"></span> '
                "or pick an example, then ask about it. The demo model knows only coloured shapes.")
HEADER = (f'<h1 id="owlet-title"><span class="owlet-icon owlet-owl" role="img" aria-label="Owl"></span>{TITLE}</h1>'
          f'<p id="owlet-how">{HOW_TO_START}</p>')
# What the bundled demo model (models/owlet-shapes-vl) can answer; anything else gets a short refusal.
DEMO_NOTE = ("The bundled demo model knows only simple pictures of coloured shapes (circles, squares, triangles, "
             "stars): ask about colours, counts, positions, the largest shape, or for a description; anything else "
             "gets a short \"I only know about shapes\" reply. Follow-up questions are about the same picture; "
             "attaching another picture starts a new conversation.")
EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
BROWSER_ID_KEY = "owlet-browser-id"
CONVERSATION_KEY = "owlet-conversation"


def example_inputs(folder: Path = EXAMPLES_DIR) -> list[list[dict]]:
    """The bundled example pictures with their suggested first questions (ui/examples/examples.json)."""
    manifest = folder / "examples.json"
    if not manifest.exists():
        return []
    return [[{"text": item["question"], "files": [str(folder / item["file"])]}]
            for item in json.loads(manifest.read_text())]


def build_page(handlers: ChatHandlers, config) -> gr.Blocks:
    """Build the Blocks for one app; nothing runs until it is launched."""
    # Gradio keeps every upload on disk until its cache is cleaned: delete files older than the TTL, that often.
    cache_ttl = config.upload_cache_ttl_s
    with gr.Blocks(title="Owlet", fill_height=True, delete_cache=(cache_ttl, cache_ttl)) as page:
        # The token kept here is signed by the server (ui.identity); BrowserState's own secret is sent to
        # every browser, so it protects nothing and is not relied on.
        browser_id = gr.BrowserState(None, storage_key=BROWSER_ID_KEY, secret=config.secret)
        last_conversation = gr.BrowserState(None, storage_key=CONVERSATION_KEY, secret=config.secret)
        tab = gr.State(new_tab_state())
        gr.HTML(HEADER, elem_id="owlet-intro", padding=False)
        # Its height at each screen size is the page's CSS (ui.page_style): what the rest of the first view leaves.
        chatbot = gr.Chatbot(elem_id="owlet-chat", label="Conversation", editable="user", show_label=False,
                             buttons=["copy"], feedback_options=None,
                             placeholder="Pick an example below, or attach a picture, and ask.",
                             # The page's script follows the conversation: Gradio's autoscroll cut off the top of a
                             # turn taller than the chat (ui.page_script).
                             autoscroll=False,
                             # A picture is the visitor's own: no download button under it (and the turn fits the
                             # phone's chat).
                             allow_file_downloads=False,
                             # A picture and its question are messages of their own: Gradio edits every message of
                             # a group as text, and failed on the picture, so editing the first question sent nothing.
                             group_consecutive_messages=False,
                             # Gradio's default, pinned: a real VLM can be made to write HTML (text in a crafted
                             # picture), and this browser holds the visitor's identity token.
                             sanitize_html=True)
        # Between the chat and the box: what happened to the last question, where the user looks (a refusal
        # under the box, or under the examples, was off a phone's screen).
        with gr.Row(elem_id="owlet-status-row"):
            status = gr.Markdown("", elem_id="owlet-status")
            new_chat = gr.Button("New conversation", elem_id="owlet-new", size="sm", scale=0, min_width=170)
        box = gr.MultimodalTextbox(elem_id="owlet-input", file_types=["image"], file_count="single",
                                   placeholder="Ask about the picture…", label="Your question", show_label=False,
                                   submit_btn=True, stop_btn=False, autofocus=True, max_plain_text_length=4000,
                                   # A long question scrolls inside the box, which stays short on a phone too.
                                   max_lines=6)
        examples = example_inputs()
        if examples:  # clicking one fills the box with the picture and a suggested first question
            gr.Examples(examples, [box], label="Examples: click one, then send", elem_id="owlet-examples",
                        examples_per_page=len(examples))
        with gr.Accordion("What can it answer?", open=False, elem_id="owlet-about"):
            gr.Markdown(DEMO_NOTE)
        with gr.Accordion("Settings", open=False, elem_id="owlet-settings"):
            answer_length = gr.Slider(1, config.max_new_tokens_cap, value=config.max_new_tokens, step=1,
                                      label="Longest answer (tokens)", elem_id="owlet-answer-length")

        streamed = [box, chatbot, status, tab]
        # The question shows in the chat at once, in the browser, however busy the page and the workers are; the
        # page's first update replaces it (ui.page_script).
        sent = box.submit(None, [box, chatbot], [chatbot, status],
                          js=show_sent_question(config.max_text_chars, BROWSER_ID_KEY), queue=False,
                          show_progress="hidden", api_visibility="private", trigger_mode="multiple")
        # trigger_mode="multiple": a question sent right after Stop or "New conversation", while the old answer's
        # event has not ended yet (its worker busy), is sent; Gradio's default dropped that Enter silently.
        chat_event = sent.then(handlers.respond, [box, answer_length, tab, browser_id], streamed,
                               api_name="chat", concurrency_limit=None, show_progress="hidden",
                               postprocess=False, trigger_mode="multiple")
        retry_event = chatbot.retry(handlers.retry, [answer_length, tab, browser_id], streamed,
                                    api_name="retry", concurrency_limit=None, show_progress="hidden",
                                    postprocess=False)
        edit_event = chatbot.edit(handlers.edit, [answer_length, tab, browser_id], streamed,
                                  api_name="edit", concurrency_limit=None, show_progress="hidden",
                                  postprocess=False)
        answering = [chat_event, retry_event, edit_event]
        # No Gradio `cancels` here: Gradio cancels by session_hash, which a client chooses. Stop cancels the
        # caller's own job (owner-checked), and the answering stream then ends by itself with "stopped".
        box.stop(handlers.stop, [tab, browser_id], [box, status, tab], api_name="stop", queue=False,
                 show_progress="hidden")
        fresh = [box, chatbot, status, tab]
        # No Gradio `cancels` either (it would end every stream of the session hash the client names): the
        # handler ends the caller's own stream (ui.chat.live_streams).
        new_event = new_chat.click(handlers.new_conversation, [tab, browser_id], fresh,
                                   api_name="new_conversation", queue=False, show_progress="hidden")
        # (The Chatbot's own trash button, which did what "New conversation" does, is not shown: ui.page_style.)
        # Remember the conversation in the browser after every change, so a reload reopens it.
        for event in (*answering, new_event):
            event.then(handlers.remember_conversation, [tab, browser_id], [last_conversation], queue=False,
                       api_visibility="private", show_progress="hidden")
        # A reload during an answer reopens the chat, then goes on streaming that answer.
        loaded = page.load(handlers.on_load, [browser_id, last_conversation, tab],
                           [browser_id, chatbot, status, tab, last_conversation], api_visibility="private",
                           show_progress="hidden")
        loaded.then(handlers.resume, [tab, browser_id], streamed, api_visibility="private",
                    concurrency_limit=None, show_progress="hidden", postprocess=False)
        # API clients get their identity the way the page does (docs/security.md, "Who is who").
        identity_token = gr.Textbox(visible=False)
        identity_token.submit(handlers.identity, [identity_token], [identity_token], api_name="identity",
                              queue=False)
    return page
