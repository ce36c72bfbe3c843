"""The soak's memory probe (``bench.soak --probe``): loaded by every Python process of the stack through PYTHONPATH,
it writes one JSON line every ``OWLET_SOAK_PROBE_S`` seconds to ``$OWLET_SOAK_PROBE_DIR/<argv>-<pid>.jsonl``:

- ``rss``: what the kernel counts; ``malloc``: glibc's ``mallinfo2`` over every arena (``arena`` + ``hblkhd`` taken
  from the system, ``uordblks`` in use, ``fordblks`` free but held); ``py_blocks``: Python objects' blocks;
- ``tensor_bytes``: what live CPU tensors hold (each storage once);
- ``types``: live objects of each type (the 25 most numerous, from ``gc.get_objects``);
- with ``OWLET_SOAK_TRACEMALLOC=1``: the 15 source lines whose allocations grew most since the first sample.

It changes nothing in the process it watches but the time the probe itself takes. Not part of Owlet.
"""
import os

if os.environ.get("OWLET_SOAK_PROBE_DIR"):
    import collections
    import ctypes
    import gc
    import json
    import sys
    import threading
    import time

    class _MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    def _malloc() -> dict:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _MallInfo2
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return {}
        return {name: getattr(info, name) for name, _ in _MallInfo2._fields_}

    def _rss() -> int:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _probe() -> None:
        with open("/proc/self/cmdline") as fh:
            words = [w for w in fh.read().split("\0") if w][1:3]
        name = "-".join(w.replace("/", "_") for w in words)[-60:] or "python"
        path = os.path.join(os.environ["OWLET_SOAK_PROBE_DIR"], f"{name}-{os.getpid()}.jsonl")
        every = float(os.environ.get("OWLET_SOAK_PROBE_S", "20"))
        traced = os.environ.get("OWLET_SOAK_TRACEMALLOC") == "1"
        first = None
        if traced:
            import tracemalloc

            tracemalloc.start(4)
        while True:
            time.sleep(every)
            objects = gc.get_objects()
            counts = collections.Counter(type(o).__name__ for o in objects)
            torch = sys.modules.get("torch")
            storages = {}
            if torch is not None:  # live CPU tensors' storages, each once: what tensors hold of the heap
                for o in objects:
                    if type(o) is torch.Tensor or type(o) is torch.nn.Parameter:
                        try:
                            if o.device.type == "cpu":
                                st = o.untyped_storage()
                                storages[st.data_ptr()] = st.nbytes()
                        except Exception:  # noqa: BLE001 — meta or sparse tensors have no plain storage
                            pass
            del objects
            line = {"t": time.time(), "rss": _rss(), "malloc": _malloc(), "py_blocks": sys.getallocatedblocks(),
                    "threads": threading.active_count(),
                    "tensor_bytes": sum(storages.values()), "tensor_storages": len(storages),
                    "types": dict(counts.most_common(25))}
            if traced:
                snap = tracemalloc.take_snapshot()
                if first is None:
                    first = snap
                line["traced_bytes"] = tracemalloc.get_traced_memory()[0]
                line["grew"] = [f"{s.size_diff / 1024:.0f} KiB {s.count_diff:+d} {s.traceback.format()[-1].strip()}"
                                for s in snap.compare_to(first, "traceback")[:15]]
            with open(path, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    threading.Thread(target=_probe, name="owlet-soak-probe", daemon=True).start()
