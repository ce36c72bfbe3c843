"""Where the demo's processes write, and what of it the demo's own terminal shows.

The worker and the page each write to a file of their own (``owlet-demo --log-dir``, by default
``.cache/demo-logs`` in the checkout): Celery's banner and its warning about running as root, Gradio's and
transformers' notices, every log line. The terminal keeps what matters to the person who started the demo: the
demo's own lines, the page's sentences for its operator (``Owlet UI: note: …``, the share link or why there is
none), and, when a process ends, the last lines it wrote.
"""
from __future__ import annotations

from pathlib import Path

# The page's lines for whoever started it (ui.server); its "Owlet UI: http://…" line is left out: the demo says
# where to go once everything is ready.
RELAYED = ("Owlet UI: ", "Owlet public link:", "No public share link")
NOT_RELAYED = ("Owlet UI: http",)
# A process's own last sentence when it cannot go on (owlet-worker, owlet-page).
LAST_WORDS = ("owlet-worker:", "owlet-page:")


def relayed(line: str) -> bool:
    """Whether a line a child wrote is shown in the demo's terminal too."""
    return line.startswith(RELAYED) and not line.startswith(NOT_RELAYED)


class ChildLogs:
    """One log file per child process in ``folder``, appended to by every start of that child."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._started: dict[str, int] = {}  # where the child's latest start begins in its file
        self._read: dict[str, int] = {}  # how far ``new_lines`` has read

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def clear(self, *names: str) -> None:
        """Start these children's files afresh (a new demo run)."""
        for name in names:
            self.path(name).unlink(missing_ok=True)

    def open_for(self, name: str):
        """The file a new start of ``name`` writes to (binary, appending; the caller closes its copy)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        out = open(self.path(name), "ab")
        self._started[name] = self._read[name] = out.tell()
        return out

    def new_lines(self, name: str) -> list[str]:
        """The whole lines ``name`` wrote since the last call."""
        start = self._read.get(name, 0)
        try:
            with open(self.path(name), "rb") as fh:
                fh.seek(start)
                data = fh.read()
        except OSError:
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self._read[name] = start + len(whole)
        return whole.decode("utf-8", "replace").splitlines()

    def last_lines(self, name: str, most: int = 8) -> list[str]:
        """What the latest start of ``name`` wrote last: its own last sentence if it said one, else its last
        ``most`` lines."""
        try:
            with open(self.path(name), "rb") as fh:
                fh.seek(self._started.get(name, 0))
                lines = [line.rstrip() for line in fh.read().decode("utf-8", "replace").splitlines() if line.strip()]
        except OSError:
            return []
        said = [line for line in lines if line.startswith(LAST_WORDS)]
        return said[-most:] if said else lines[-most:]
