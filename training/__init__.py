"""Owlet's bundled demo model: a tiny LFM2-VL trained on procedurally generated shape scenes.

Entry points: ``python -m training.train --recipe demo-present-wide-grouped`` (train from random weights and save the checkpoint)
and ``python -m training.eval [--mode generate|engine]`` (exact match per question type and turn on fresh
held-out scenes, and the refusal rate on out-of-domain probes).
"""
