"""The page's input box, as the updates an answering event sends it."""
from __future__ import annotations

import gradio as gr

EMPTY_BOX = {"text": "", "files": []}  # the box's value in wire format (answer events skip post-processing)


def box(busy: bool, text: str = ""):
    """The input box: locked with a Stop button while answering, open with Send otherwise.

    An update, never a new component: a component made inside an event joins that tab's Gradio config under
    a new id (that is how ``gr.render`` works) and stays there, with its value, for the tab's life, so every
    answer would grow the page's memory by a box (by a 900 KB question, when the box gives a refused question
    back)."""
    if busy:
        return gr.update(value=EMPTY_BOX, interactive=False, submit_btn=False, stop_btn=True)
    return gr.update(value={"text": text, "files": []}, interactive=True, submit_btn=True, stop_btn=False)


def box_as_sent():
    """The input box opened again with whatever it holds: a refused question keeps its text and its picture, and
    a retry or edit refused leaves a draft the user is typing alone. (The page does not clear the box on send;
    the first update of an admitted turn does.)"""
    return gr.update(interactive=True, submit_btn=True, stop_btn=False)
