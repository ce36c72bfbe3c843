"""An uploaded picture, from Gradio's upload route to a chat turn.

Budgets of upload bytes per address and for the page (``budget``), who uploaded each file (``owners``), which
stored uploads give way when the page's budget is full (``room``), what an upload leaves in Gradio's cache and the
sweeper of its empty directories (``cache_dirs``), the image check every turn's picture passes
(``image_check``, with its remembered verdicts in ``decode_verdicts``), and a reopened conversation's pictures
written back (``restored_pictures``).
"""
