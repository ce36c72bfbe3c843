"""Owlet's bundled demo model: a tiny LFM2-VL trained on procedurally generated shape scenes.

Entry points: ``python -m training.train`` (train and save the checkpoint) and
``python -m training.eval`` (exact-match accuracy per question type on fresh held-out scenes).
"""
