"""EngineConfig: every engine knob in one validated dataclass; ``from_env`` is the only place env vars are read."""
from __future__ import annotations

from dataclasses import dataclass, fields

from owlet.settings import read_fields

from . import limits

PARK_MODES = ("none", "int8", "int4")
CPU_KERNELS = ("packed", "onednn", "panel")  # the kernels of engine/models/cpu/linear.py, by the names cpu_kernels takes
ENV_PREFIX = "OWLET_"  # field max_running is read from OWLET_MAX_RUNNING
# Default answers held per decode row with time slicing. Clients beyond the held answers wait in Redis for one to
# end, and with slicing every held answer ends later, so this is how many distinct clients with long answers it
# takes before a newcomer waits for an answer to end rather than for a slice (paused caches wait in host memory).
ACTIVE_PER_ROW = 4


@dataclass
class EngineConfig:
    model: str  # local checkpoint folder (HF layout)
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    trust_remote_code: bool = False  # only for checkpoints that ship their own modelling code (mPLUG-Owl3 needs none)
    allow_unverified: bool = False  # serve an architecture missing from engine/models/families.py (with a warning)
    max_running: int = 16  # sequences in the decode batch
    # Time slicing (engine/time_slicing.py): an answer waiting for a decode row while another group holds more
    # rows takes the row of that group's answer that has decoded the most tokens since it last (re)joined, once
    # that answer has decoded at least this many; the paused answer's cache is copied out exactly and it resumes
    # when its turn comes. 0: off (rows are held until answers end).
    time_slice_tokens: int = 64
    # Answers the engine holds at once, in decode rows or paused. None: 4 x max_running with time slicing on, else
    # max_running. The worker announces this as its capacity, and the dispatcher keeps the part beyond
    # max_running for clients with nothing running (worker/queue/dispatch.py), so a newcomer reaches the engine.
    max_active: int | None = None
    max_prefill_tokens: int = 512  # prompt tokens prefilled between two decode steps (chunked beyond this)
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings
    max_waiting: int = 256  # requests queued inside the engine before add_request refuses
    max_image_pixels: int = limits.MODEL_MAX_PIXELS  # larger images are downscaled before preprocessing
    max_images_per_request: int = limits.MAX_IMAGES_PER_REQUEST
    default_deadline_s: float | None = 300.0  # wall-clock cap per request unless the request sets one
    # Session cache (multi-turn KV reuse) and image feature cache.
    session_cache: bool = True
    session_budget_mb: float | None = None  # None: 256 MB on CPU; a fraction of free memory on CUDA
    session_budget_fraction: float = 0.5  # CUDA only: share of free memory after load and batch reserve
    # Most of each session pool one client group may hold (the worker names it: the address or login the page
    # derived): a client's many conversations then evict its own oldest caches, never everyone
    # else's. An entry larger than the share is not kept (that conversation's next turn recomputes). 1.0: no cap.
    session_group_share: float = 0.25
    # Prefixes another conversation already computed (the same picture and question, the same system prompt and
    # picture) are restored for a new conversation by content (engine/kv/prefix_index.py), under the same budgets.
    shared_prefixes: bool = True
    park_mode: str = "none"  # how idle sessions are held: none (model dtype, on device) | int8 | int4 (host memory)
    session_host_budget_mb: float = 4096.0  # host memory for parked (int8/int4) sessions of an accelerator engine
    park_group_size: int = 64  # values per scale: int8 keeps 0.52 and int4 0.28 of 16-bit bytes
    image_cache_mb: float = 64.0
    # Disk tier (engine/kv/disk_tier.py): every session entry kept is also written to a file in this folder, stored as
    # parked entries are (park_mode), so it outlives host memory and the worker; a worker started again on the same
    # folder serves its conversations' follow-ups from those files. One worker per folder (a second is refused).
    # None: no disk tier.
    disk_cache_dir: str | None = None
    disk_cache_mb: float = 4096.0  # the folder's bound: least recently used files are deleted beyond it
    # Decode batch storage (engine/batch/decode_batch.py): auto (the path the family row names, engine/models/families.py) |
    # slots (K/V and conv states preallocated per running row, written in place; only for a family whose row
    # names it) | dynamic (a DynamicCache concatenated as rows join and leave; any family).
    decode_cache: str = "auto"
    # Requests that reach the engine together (in one step's intake) are queued longest max_new_tokens first, so
    # a burst's long answers start early instead of running alone at its end; across steps order stays FIFO.
    admit_longest_first: bool = True
    # Static-shape decode over slots: off | static (bucketed shapes, eager: the CPU-testable path) | cuda (the
    # same, captured as CUDA graphs) | auto (cuda on a CUDA device when the slot cache is used, else off). On an
    # H200 the captured step is token-identical to the same step run eagerly and 3.2-7.1x faster (docs/benchmarks.md).
    decode_graphs: str = "auto"
    # Prompts admitted in the same step are prefilled together, left-padded, in as few forwards as keep padding
    # under a quarter of the positions (engine/batch/prefill_batch.py), on the families verified token-exact that way
    # (``prefill_together`` in engine/models/families.py); a follow-up turn and a later chunk prefill alone. on | off (every
    # prompt alone) | auto: on for a CUDA device, off on CPU, where a batched forward of a burst measured slower
    # than the same prompts one by one (bench.prefill_burst, docs/benchmarks.md).
    batched_prefill: str = "auto"
    # Fused decode step: the static-shape step's forward through torch.compile (inductor), so its many small kernels
    # are fused; with decode_graphs=cuda the compiled kernels are captured in the graph. Needs decode_graphs static
    # or cuda. Off until measured on a device (bench/gpu_decode.py --graphs off,cuda,cuda-compiled).
    decode_compile: bool = False
    # Decode attention over slots: varlen (each run of rows attends only up to its own longest row; see
    # engine/batch/varlen_attention.py) | padded (one call over the batch's longest row, the tail masked).
    decode_attention: str = "varlen"
    # fp32 on CPU: the text stack's matmuls through faster kernels than torch's own (engine/models/cpu/): MKL's packed
    # GEMM, oneDNN's GEMM, Owlet's panel GEMM (AVX2 C, built with the system's C compiler at first use).
    # auto: each matrix shape and row count takes the fastest of them and torch's own, as measured at load on
    # this CPU; a kernel that reads a copy of the weights (packed, panel) only where the copy fits in a quarter of
    # the available memory | off: torch's own products, and engine/models/cpu/ is not even imported | a comma list of
    # kernel names (e.g. "onednn", "packed,panel"): those, on every product of 3 rows or more they can take
    # (packed on decode rows, up to 16), unmeasured; refused where one cannot run.
    cpu_kernels: str = "auto"
    kv_pool_mb: float | None = None  # slot pool budget; None: 512 MB on CPU, half the free memory on CUDA
    seed: int = 0

    def __post_init__(self):
        if not self.model:
            raise ValueError("EngineConfig.model must name a checkpoint folder")
        self.model = resolve_model(self.model)
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.max_running < 1 or self.max_prefill_tokens < 16 or self.max_waiting < 1:
            raise ValueError("max_running >= 1, max_prefill_tokens >= 16 and max_waiting >= 1 are required")
        if self.time_slice_tokens < 0:
            raise ValueError("time_slice_tokens must be >= 0 (0 turns time slicing off)")
        self.max_active = resolve_max_active(self.max_running, self.max_active, self.time_slice_tokens,
                                             self.max_waiting)
        if self.max_waiting < self.max_active - self.max_running:
            raise ValueError(f"max_waiting ({self.max_waiting}) must hold the answers beyond the decode rows "
                             f"(max_active - max_running = {self.max_active - self.max_running})")
        if self.park_mode not in PARK_MODES:
            raise ValueError(f"park_mode must be one of {PARK_MODES}, got {self.park_mode!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.disk_cache_mb <= 0:
            raise ValueError("disk_cache_mb must be > 0")
        if self.session_host_budget_mb < 0:
            raise ValueError("session_host_budget_mb must be >= 0")
        if self.session_budget_mb is not None and self.session_budget_mb < 0:
            raise ValueError(f"session_budget_mb must be >= 0 (megabytes), got {self.session_budget_mb}")
        if self.kv_pool_mb is not None and self.kv_pool_mb <= 0:
            raise ValueError(f"kv_pool_mb must be > 0 (megabytes), got {self.kv_pool_mb}")
        if self.decode_graphs not in ("auto", "off", "static", "cuda"):
            raise ValueError(f"decode_graphs must be auto, off, static or cuda, got {self.decode_graphs!r}")
        if self.decode_attention not in ("varlen", "padded"):
            raise ValueError(f"decode_attention must be varlen or padded, got {self.decode_attention!r}")
        if self.batched_prefill not in ("auto", "on", "off"):
            raise ValueError(f"batched_prefill must be auto, on or off, got {self.batched_prefill!r}")
        if self.decode_cache not in ("auto", "slots", "dynamic"):
            raise ValueError(f"decode_cache must be auto, slots or dynamic, got {self.decode_cache!r}")
        if self.cpu_kernels not in ("auto", "off") and not {
                name.strip() for name in self.cpu_kernels.split(",")} <= set(CPU_KERNELS):
            raise ValueError(f"cpu_kernels must be auto, off or a comma list of {', '.join(CPU_KERNELS)}, got "
                             f"{self.cpu_kernels!r}")
        if not 0.0 < self.session_group_share <= 1.0:
            raise ValueError("session_group_share must be in (0, 1]")
        if not 0.0 < self.session_budget_fraction <= 0.95:
            raise ValueError("session_budget_fraction must be in (0, 0.95]")

    @classmethod
    def from_env(cls, env=None, **overrides) -> "EngineConfig":
        """Read ``OWLET_<FIELD>`` variables (e.g. OWLET_MODEL, OWLET_MAX_RUNNING, OWLET_PARK_MODE).

        Values are parsed by ``owlet.settings`` (the rules every Owlet process shares); a bad value raises
        ``owlet.settings.SettingError`` naming the variable.
        """
        values = read_fields(cls, ENV_PREFIX, env)
        values.update(overrides)
        if "model" not in values:
            raise ValueError("OWLET_MODEL is not set: point it at a local checkpoint folder")
        return cls(**values)


def resolve_model(model: str) -> str:
    """``model`` as given, or the folder of the Hugging Face cache holding it when it names a cached repository (its
    id, or its folder in the cache) rather than a checkpoint folder (engine/models/checkpoint_folder.py)."""
    from .models.checkpoint_folder import checkpoint_folder

    return str(checkpoint_folder(model))  # "~" expanded too, as a .env file or a quoted setting leaves it


def resolve_max_active(max_running: int, max_active: int | None, time_slice_tokens: int, max_waiting: int) -> int:
    """How many answers the engine holds at once (``EngineConfig.max_active``), with its default filled in: the
    answers beyond the rows wait in the engine's queue, so the default never asks for more than it holds."""
    if max_active is None:
        return min(ACTIVE_PER_ROW * max_running, max_running + max_waiting) if time_slice_tokens else max_running
    if max_active < max_running:
        raise ValueError(f"max_active ({max_active}) must be at least max_running ({max_running})")
    return max_active


def max_active_from_env(env=None) -> int:
    """``max_active`` as an engine built from these variables would resolve it, without a model: the worker's
    launchers size Celery's threads by it (each answer in the engine holds one thread while it streams)."""
    values = read_fields(EngineConfig, ENV_PREFIX, env)
    defaults = {f.name: f.default for f in fields(EngineConfig)}
    get = lambda name: values.get(name, defaults[name])  # noqa: E731
    return resolve_max_active(get("max_running"), values.get("max_active"), get("time_slice_tokens"),
                              get("max_waiting"))
