"""owlet.allocator: glibc holds memory a process freed, and malloc_trim gives it back.

Each check runs in a fresh Python (a subprocess), so what this test process allocated says nothing. Four threads
allocate 200 MB in 2 KB blocks (through malloc, not Python's small-object allocator), all of it live at once, then
free all but one block in 64: the free chunks lie between live ones, so glibc cannot shrink its heaps and the
process keeps the pages.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FRAGMENT = """
import json, sys, threading, time
sys.path.insert(0, {root!r})
from owlet import allocator

def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))

keep = []
all_allocated = threading.Barrier(4)
def work():
    blocks = [bytes(2000) for _ in range(25000)]  # 50 MB per thread
    all_allocated.wait()  # all 200 MB live at once: no thread reuses another's freed chunks
    keep.extend(blocks[::64])

base = rss_mb()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
held = rss_mb()
{remedy}
for _ in range(30):  # a trimming thread runs on its own time: up to 3 s on a loaded machine
    if rss_mb() - base < 40:
        break
    time.sleep(0.1)
print(json.dumps({{"base": base, "held": held, "after": rss_mb()}}))
"""


def run(remedy: str) -> dict:
    code = FRAGMENT.format(root=str(ROOT), remedy=remedy)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")


def test_freed_memory_stays_held_without_a_trim():
    figures = run("pass")
    assert figures["held"] - figures["base"] > 100, figures  # ~200 MB taken, 3 MB of it live
    assert figures["after"] - figures["base"] > 100, f"glibc gave the freed pages back by itself: {figures}"


def test_trim_now_gives_the_freed_pages_back():
    figures = run("assert allocator.trim_now()")
    assert figures["held"] - figures["base"] > 100, figures
    assert figures["after"] - figures["base"] < 40, f"malloc_trim left the freed memory held: {figures}"


def test_the_trimming_thread_gives_them_back_on_its_own():
    figures = run("thread = allocator.start_trimming(0.05); assert thread is not None")
    assert figures["after"] - figures["base"] < 40, f"the trimming thread did not run: {figures}"


def test_off_means_no_thread():
    from owlet.allocator import start_trimming

    assert start_trimming(0) is None
