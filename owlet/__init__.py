"""Owlet's glue that belongs to no single layer: the one settings parser and the local demo launcher.

Importing this package loads nothing (no torch, Celery, Redis or Gradio).
"""
