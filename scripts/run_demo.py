"""Kept so older commands still work: ``python scripts/run_demo.py`` is ``owlet-demo`` (``owlet/demo.py``)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # also before the project is installed
from owlet.demo import *  # noqa: E402,F401,F403  (Stack, DEFAULT_MODEL, ROOT, ... for scripts/screenshot.py)
from owlet.demo import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
