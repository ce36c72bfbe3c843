"""The page's look: its layout at a laptop's and a phone's size, and its own icons (``CSS``, given to ``launch()``).

The first view must show how to start without scrolling: the two-line instructions, the input box and the
examples, at 1280x800 and at 390x844 (``tests/ui/test_first_view.py``). The chat takes the height that is left.

Icons are SVG drawn here, as CSS images, never emoji: a browser without an emoji font (many Linux desktops,
headless Chromium) draws an emoji as an empty box. The owl keeps its colours (a background image); the others are
masks filled with the text colour, so they follow the theme, dark mode included.
"""
from string import Template
from urllib.parse import quote


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
/* The chat takes what the header, the status line, the box and the examples leave of the screen. */
#owlet-chat { height: calc(100vh - 430px) !important; min-height: 180px !important; }
/* The chat's own buttons (the trash) get a band of their own above the messages: laid over the scrolling messages,
   they covered the top message's copy and edit buttons on a phone. */
#owlet-chat > .wrapper { display: flex; flex-direction: column; }
#owlet-chat > .wrapper > .top-panel { position: static; align-self: flex-end; margin: 4px 4px 0 0; }
#owlet-chat > .wrapper > .bubble-wrap { flex: 1 1 auto; min-height: 0; }
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
}
""").substitute(owl=OWL, clip=PAPERCLIP, plus=PLUS)
