"""Celery command-line entry point: ``celery -A worker.main worker -P threads -c 8 -n gpu0@%h``.

The Celery CLI needs a module-level app; building it reads settings from the environment but opens
no connection and loads no model (the engine starts in the worker_init signal).
"""
from worker.celery_app import create_app

app = create_app(with_runtime=True)
