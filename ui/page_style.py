"""The page's look: its layout at a laptop's and a phone's size, and its own icons (``CSS``, given to ``launch()``).

The first view must show how to start without scrolling: the two-line instructions, the input box and the
examples, at 1280x800 and at 390x844 (``tests/ui/test_first_view.py``). The chat takes the height that is left.

Gradio's own progress and queue counters ("queue: 1/1 | 0.2/0.3s", "processing | 0.5s") are not shown, not even to
screen readers: the status line says where a question is, in Owlet's words. Nor are two of the chat's buttons: its
trash, which did what "New conversation" does, and the Share button on a picture, which works only on Hugging Face
Spaces. What these rules name of Gradio's front end is checked at start-up (``ui.gradio_adapters.front_end``).

Icons are SVG drawn here, as CSS images, never emoji: a browser without an emoji font (many Linux desktops,
headless Chromium) draws an emoji as an empty box. The owl keeps its colours (a background image); the others are
masks filled with the text colour, so they follow the theme, dark mode included.
"""
from string import Template
from urllib.parse import quote

# Gradio's front end, as these rules name it (ui.gradio_adapters.front_end checks its bundle still has each).
STATUS_TRACKER = '[data-testid="status-tracker"]'
SHARE_ICON = "M23,20a5,5,0,0,0-3.89,1.89"  # the start of the Share button's icon path (its label is translated)


def _svg(body: str, view_box: str = "0 0 24 24") -> str:
    """A CSS ``url()`` of an SVG image with ``body`` inside."""
    svg = f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='{view_box}'>{body}</svg>"
    return 'url("data:image/svg+xml,' + quote(svg, safe=" =:/'") + '")'


OWL = _svg("<path d='M6 3l5 5q5-2 10 0l5-5-1 11q3 6-1 12-8 6-16 0-4-6-1-12z' fill='#8a5a2b'/>"
           "<circle cx='11.5' cy='14' r='4.5' fill='#fff'/><circle cx='20.5' cy='14' r='4.5' fill='#fff'/>"
           "<circle cx='11.5' cy='14' r='2' fill='#222'/><circle cx='20.5' cy='14' r='2' fill='#222'/>"
           "<path d='M14.5 18h3L16 21.5z' fill='#f0a020'/>", "0 0 32 32")
PAPERCLIP = _svg("<path d='M9 7v9a3 3 0 0 0 6 0V6a4.5 4.5 0 0 0-9 0v11a6 6 0 0 0 12 0V8' fill='none' stroke='#000' "
                 "stroke-width='2' stroke-linecap='round' transform='rotate(40 12 12)'/>")
PLUS = _svg("<path d='M12 5v14M5 12h14' fill='none' stroke='#000' stroke-width='2.5' stroke-linecap='round'/>")

CSS = Template("""
.owlet-icon { display: inline-block; width: 1.1em; height: 1.1em; vertical-align: -0.18em; }
.owlet-owl { background: $owl center / contain no-repeat; margin-right: 0.35em; width: 1.25em; height: 1.25em; }
.owlet-clip { -webkit-mask: $clip center / contain no-repeat; mask: $clip center / contain no-repeat;
              background-color: currentColor; }
#owlet-new::before { content: ""; display: inline-block; width: 1em; height: 1em; margin-right: 0.3em;
                     -webkit-mask: $plus center / contain no-repeat; mask: $plus center / contain no-repeat;
                     background-color: currentColor; }
#owlet-intro { padding: 0; }
#owlet-title { font-size: 1.5em; margin: 0 0 0.15em 0; line-height: 1.2; }
#owlet-how { margin: 0; line-height: 1.4; }
#owlet-status { min-height: 1.6em; opacity: 0.85; font-size: 0.9em; }
#owlet-status p { margin: 0; display: inline; }  /* the sentence and its figures' toggle share a line */
#owlet-status details.owlet-figures { display: inline; margin-left: 0.4em; }
#owlet-status details.owlet-figures summary { display: inline; cursor: pointer; text-decoration: underline dotted;
                                             opacity: 0.8; }
#owlet-status details.owlet-figures[open] summary { margin-right: 0.4em; }
/* Gradio's counters: the status line speaks instead. */
$tracker { display: none !important; }
/* The chat's trash (its only button above the messages) and a picture's Share button. */
#owlet-chat > .wrapper > .top-panel { display: none !important; }
#owlet-chat .message-buttons button:has(path[d^="$share"]) { display: none !important; }
/* The chat takes what the header, the status line, the box and the examples leave of the screen. */
#owlet-chat { height: calc(100vh - 430px) !important; min-height: 180px !important; }
/* A picture in the chat is a reminder of what is asked about, not the whole view (its fullscreen button shows it
   whole): the conversation under it stays in sight. */
#owlet-chat .message-row img { max-height: 10em; width: auto; }
footer { display: none !important; }
@media (max-width: 640px) {
  /* A phone puts the status line above a full-width "New conversation": a long refusal keeps the screen's width. */
  #owlet-status-row { flex-direction: column; align-items: stretch; }
  #owlet-new { flex-grow: 1 !important; width: 100% !important; }
  #owlet-title { font-size: 1.2em; }
  #owlet-how { font-size: 0.85em; line-height: 1.35; }
  #owlet-chat { height: calc(100vh - 500px) !important; min-height: 160px !important; }
  #owlet-chat .message-row img { max-height: 7em; }
  /* Empty, the chat is the one line that says how to start, so the examples come up into the first view. */
  #owlet-chat:has(.placeholder-content) { height: auto !important; min-height: 0 !important; }
  #owlet-chat .placeholder-content { padding: 0.6em 0; }
  /* The examples side by side, as even cards: the picture above its question. */
  #owlet-examples .gallery { display: grid; grid-template-columns: repeat(auto-fill, minmax(100px, 1fr)); gap: 6px; }
  #owlet-examples .gallery-item { width: 100%; margin: 0; }
  #owlet-examples .gallery-item .container { flex-direction: column-reverse; align-items: center; gap: 4px;
                                             padding: 4px; }
  #owlet-examples .gallery-item img { width: 100%; height: auto; max-height: 80px; object-fit: contain; margin: 0; }
  #owlet-examples .gallery-item p { font-size: 0.8em; line-height: 1.25; text-align: center; margin: 0; }
}
""").substitute(owl=OWL, clip=PAPERCLIP, plus=PLUS, tracker=STATUS_TRACKER, share=SHARE_ICON)
