"""``python -m worker``: the same as ``owlet-worker`` (see ``worker.main``)."""
import sys

from worker.main import run

sys.exit(run())
