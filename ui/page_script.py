"""The page's own script: what the browser does before, or instead of, what Gradio's front end would.

- **A picture over the upload limit is never dropped.** Gradio's front end checks a file's size itself and, over
  its limit, shows a toast and drops the file, and the question went out without it: the visitor got an answer to
  a question they had not asked. Gradio's own check is off (``ui.server`` launches with no client-side limit), and
  this script sends a small stand-in (``ui.uploads.stand_in``) in place of a file over Owlet's limit, on the one
  request every upload takes (``POST …/gradio_api/upload``, whatever way the file was picked: the paperclip,
  a drop, a paste). The turn that names it is refused with Owlet's own sentence, in the chat, and no answer.
  The upload route still refuses a larger file itself (``ui.gradio_adapters.upload_parser``).
- **The chat follows the conversation without cutting the latest question.** Gradio's own autoscroll (off)
  jumped to the bottom on every update: a turn taller than the chat (a picture, its question and the answer) lost
  its top. The chat is scrolled so that the latest turn shows whole, or from its top when it does not fit; a
  visitor who scrolls up to read is left there until they send again or come back to the end.

``show_sent_question`` gives the send event's first step, run in the browser: the question shows in the chat at once,
with Owlet's waiting line, however busy the page and the workers are; the page's first update then replaces it. A
question sent before the page's load event has given a new browser its identity waits for it, in the browser.

The front-end parts this script and the page's style rely on are checked at start-up
(``ui.gradio_adapters.front_end``).
"""
from __future__ import annotations

import base64
import json
from string import Template

from ui.shared import wording
from ui.uploads.stand_in import MARK, stand_in_picture

# Which of the chat's elements the script reads (ui.gradio_adapters.front_end checks Gradio still draws them).
CHAT_SCROLLER = "#owlet-chat .bubble-wrap"
USER_ROW = "message-row"  # with "user-row": Gradio gives each message group a row of these classes
SENDING = "Sending your question…"

_HEAD = Template("""<script>
(() => {
  "use strict";
  // A file over the upload limit goes as a stand-in the turn then refuses (ui/page_script.py).
  const LIMIT = $limit, MARK = $mark;
  const STAND_IN = Uint8Array.from(atob($picture), (c) => c.charCodeAt(0));
  const send = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const url = typeof input === "string" ? input : (input && input.url) || "";
    const body = init && init.body;
    if (body instanceof FormData && /\\/gradio_api\\/upload(\\?|$$)/.test(url)
        && body.getAll("files").some((f) => f instanceof Blob && f.size > LIMIT)) {
      const form = new FormData();
      for (const [key, value] of body.entries()) {
        const over = key === "files" && value instanceof Blob && value.size > LIMIT;
        const name = value.name || "picture.png";
        form.append(key, over ? new File([STAND_IN, MARK + value.size], name, {type: "image/png"}) : value);
      }
      init = {...init, body: form};
    }
    return send(input, init);
  };

  // The chat shows the latest turn whole, or from its top when it is taller than the chat.
  let box = null, rows = 0, following = true, ours = false, pending = false;
  const latestTurnTop = () => {
    // The latest question's first row: a picture and its question are rows of their own.
    const all = [...box.querySelectorAll($row)], asked = (i) => all[i].classList.contains("user-row");
    let i = all.length - 1, first = null;
    while (i >= 0 && !asked(i)) i--;
    while (i >= 0 && asked(i)) first = all[i--];
    if (!first) return 0;
    return first.getBoundingClientRect().top - box.getBoundingClientRect().top + box.scrollTop - 8;
  };
  const place = () => {
    pending = false;
    const questions = box.querySelectorAll($row + ".user-row").length;
    if (questions > rows) following = true;  // a question just sent: show it
    rows = questions;
    if (!following) return;
    const target = Math.max(0, Math.min(box.scrollHeight - box.clientHeight, latestTurnTop()));
    if (Math.abs(box.scrollTop - target) > 1) { ours = true; box.scrollTop = target; }
  };
  const later = () => { if (!pending) { pending = true; requestAnimationFrame(place); } };
  const watch = (found) => {
    box = found;
    new MutationObserver(later).observe(box, {childList: true, subtree: true, characterData: true});
    box.addEventListener("load", later, true);  // a picture that loads grows its message
    box.addEventListener("scroll", () => {
      if (ours) { ours = false; return; }
      const end = box.scrollHeight - box.clientHeight;
      following = box.scrollTop >= Math.min(end, latestTurnTop()) - 24;
    });
    later();
  };
  const look = () => {
    const found = document.querySelector($scroller);
    if (found && found !== box) watch(found);
  };
  new MutationObserver(look).observe(document.documentElement, {childList: true, subtree: true});
  look();
})();
</script>""")


def page_head(max_upload_bytes: int) -> str:
    """The ``<script>`` given to ``launch(head=...)``."""
    picture = base64.b64encode(stand_in_picture()).decode()
    return _HEAD.substitute(limit=int(max_upload_bytes), mark=json.dumps(MARK), picture=json.dumps(picture),
                            row=json.dumps("." + USER_ROW), scroller=json.dumps(CHAT_SCROLLER))


_SHOW_SENT = Template("""async (box, chat) => {
  // A new browser gets its identity from the page's load event, kept in its storage under $key: a question sent
  // before then was refused ("could not tell who you are"), so the send waits for it (a moment, at most $wait_ms ms).
  for (let waited = 0; !localStorage.getItem($key) && waited < $wait_ms; waited += 50)
    await new Promise((done) => setTimeout(done, 50));
  const text = ((box && box.text) || "").trim(), files = (box && box.files) || [];
  // text holding half of a UTF-16 pair (a broken paste) has no UTF-8 form: the page refuses it without reading on
  const broken = typeof text.isWellFormed === "function" ? !text.isWellFormed()
    : /[\\uD800-\\uDBFF](?![\\uDC00-\\uDFFF])|(^|[^\\uD800-\\uDBFF])[\\uDC00-\\uDFFF]/.test(text);
  if ((!text && !files.length) || text.length > $max_chars || broken) return [chat, ""];
  // A picture as Markdown: the chat draws it at once, where an image message would first load its component.
  const content = files.filter((file) => file.url).map((file) => ({type: "text", text: `![]($${file.url})`}));
  if (text) content.push({type: "text", text});
  const message = (role, content) => ({role, content, metadata: null, options: null});
  return [[...(chat || []), message("user", content), message("assistant", [{type: "text", text: $waiting}])],
          $sending];
}""")


IDENTITY_WAIT_MS = 15000  # how long a send waits for a new browser's identity before it goes anyway


def show_sent_question(max_text_chars: int, identity_key: str) -> str:
    """The send event's first step (a ``js`` function of the box and the chat, giving the chat and the status
    line): once the browser holds its identity (the ``gr.BrowserState`` stored under ``identity_key``), the question
    and a waiting line, shown before the page answers. Nothing is shown for what the page refuses before it reads it
    (an empty box, a question over ``max_text_chars``, text with an unpaired surrogate)."""
    return _SHOW_SENT.substitute(max_chars=int(max_text_chars), waiting=json.dumps(wording.waiting(SENDING)),
                                 sending=json.dumps(SENDING), key=json.dumps(identity_key),
                                 wait_ms=IDENTITY_WAIT_MS)
