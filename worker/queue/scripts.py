"""The Lua scripts behind every queue and job-state change, so several UI processes and workers can act at once
without losing or duplicating a job. Each script is one atomic step of the job life cycle:

    submit -> (queued) -> pop -> (dispatched) -> claim -> (started) -> finish -> (done | error | cancelled)
                  ^                                |          |
                  +------------ requeue -----------+----------+   (worker died: once, then finish error)

The queue is fair between client *groups* (a client address, or a login), then between a group's *identities*:
every queued job waits in one sorted set, the line, ordered by its virtual tag (the round it is served in, then its
group's place in a round), so admitting, serving and telling a job its place each cost O(log N) in the N waiting
(``worker/queue/lua/line.lua``; docs/design.md "Fair dispatch"). Fifty identities made up at one address get one
address's share.

The scripts live in ``worker/queue/lua``, one file each, plus the helper files they share, one per concern
(``HELPERS``). Redis runs them as the functions of one library (``FUNCTION LOAD``, then ``FCALL``), put together
when ``Scripts`` is built:

    the library's shebang line, named after a digest of its text (``owlet_<digest>``)
    a prelude written here: the data model's names from ``worker.store.keys`` as the Lua tables KEY_NAMES (key
        names and prefixes, without the key prefix), JOB, CONV, SLOTS, STATE and ENTRY, TURNS_SUFFIX and
        TOKEN_EVENT; the values of ``worker.queue.fairness`` as HALF_LIFE, USAGE_WEIGHT, USAGE_CAP and
        FIFO_GROUP; and the history budget's charges from ``worker.store.memory_model`` as CONV_BYTES, TURN_BYTES,
        INDEX_BYTES and CLEARED_BYTES
    common.lua (begin_call, which decodes a call's named arguments and gives KEY the call's key prefix)
    the helpers: usage.lua (a group's recent use), budgets.lua (pictures and history), line.lua (the fair line),
        lifecycle.lua (a job starts and ends), dispatch.lua (POP's step)
    each script file's body as a function, registered as ``owlet_<digest>_<script>`` with its shebang's flags

The library's text and helpers run once, when Redis loads it; a call runs only ``begin_call`` and its script's body.
(Run as EVAL scripts, the same text would build every helper and table again on every call: a fifth of SUBMIT's
time.) Redis keeps the library until it restarts without its data: a call that finds it missing loads it and runs
again (``Scripts.call``). Two versions of Owlet on one Redis each run their own library, as their digests differ.

A script takes one JSON object of named arguments as its first argument (its file's header lists them, and
``Scripts.call`` adds the key prefix as ``prefix``), and as its second the deployment's settings it reads, one JSON
text the same on every call, which the library decodes once and keeps (``settings_json``; '' for none); SUBMIT also
takes the bytes of an image sent with the turn as the third (argv[3]), which JSON cannot carry. No script takes KEYS: Owlet runs on one Redis (not a cluster), and
every key a script touches is a name or prefix from KEY. The library's text does not depend on the prefix, so one
copy serves every deployment sharing a Redis.

The shebang lines decide what a full Redis may still run: SUBMIT's bare ``#!lua`` registers it without flags, so
Redis refuses it whole when it is over maxmemory (nothing is half-written); the scripts that end or move jobs
already admitted carry ``allow-oom``, so a full Redis never strands a job; so does MAKE_ROOM, which clears old
conversations and pictures when SUBMIT was refused that way, before it is asked again, and TRUNCATE, which only
removes turns. ``compose`` puts a
test's own script together with the same prelude and helpers, to run as an EVAL script.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import redis

from worker.store import memory_model
from worker.store.keys import (TOKEN_EVENT, TURNS_SUFFIX, ConvField, EntryField, JobField, JobState, Keys, SlotsField,
                               fields_of)
from worker.queue.fairness import FIFO_QUEUE, GROUP_USAGE_CAP_S, GROUP_USAGE_HALF_LIFE_S, GROUP_USAGE_WEIGHT

LUA_DIR = Path(__file__).with_name("lua")
COMMON = "common"
# The helper files, in the order each may use those before it.
HELPERS = ("usage", "budgets", "line", "lifecycle", "dispatch")
SCRIPTS = ("submit", "pop", "claim", "finish", "requeue", "position", "make_room", "truncate", "adopt_line", "leave")
# The data model's declarations, by the name of the Lua table that carries each (besides KEY_NAMES).
LUA_TABLES = {"JOB": JobField, "CONV": ConvField, "SLOTS": SlotsField, "STATE": JobState, "ENTRY": EntryField}
_LUA_RESERVED = frozenset("and break do else elseif end false for function if in local nil not or repeat return "
                          "then true until while".split())


def lua_file(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def lua_tables() -> dict[str, dict[str, str]]:
    """Every table the prelude defines, by its Lua name: KEY_NAMES (the key names for the prefix ""), and the hash
    and state declarations."""
    return {"KEY_NAMES": Keys("").for_scripts(), **{name: fields_of(cls) for name, cls in LUA_TABLES.items()}}


def prelude() -> str:
    """The Lua that defines the data model's names and the fairness values the scripts read."""
    lines = ["-- written by worker.queue.scripts from worker.store.keys and worker.queue.fairness"]
    for table, names in lua_tables().items():
        entries = ", ".join(f"{_lua_name(name)} = {_lua_string(value)}" for name, value in names.items())
        lines.append(f"local {table} = {{{entries}}}")
    lines.append(f"local TURNS_SUFFIX, TOKEN_EVENT = {_lua_string(TURNS_SUFFIX)}, {_lua_string(TOKEN_EVENT)}")
    lines.append(f"local CONV_BYTES, TURN_BYTES, INDEX_BYTES, CLEARED_BYTES = {memory_model.CONVERSATION_BYTES}, "
                 f"{memory_model.TURN_BYTES}, {memory_model.INDEX_ENTRY_BYTES}, {memory_model.CLEARED_BYTES}")
    lines.append(f"local HALF_LIFE, USAGE_WEIGHT, USAGE_CAP = "
                 f"{GROUP_USAGE_HALF_LIFE_S!r}, {GROUP_USAGE_WEIGHT!r}, {GROUP_USAGE_CAP_S!r}")
    lines.append(f"local FIFO_GROUP = {_lua_string(FIFO_QUEUE)}")
    return "\n".join(lines)


def shared_text() -> str:
    """What every script's body runs after: the prelude, common.lua and the helpers."""
    return "\n".join([prelude(), lua_file(COMMON), *(lua_file(h) for h in HELPERS)])


def shebang_and_body(text: str, name: str) -> tuple[str, str]:
    """A script's ``#!lua`` shebang line and the body after it."""
    shebang, body = text.split("\n", 1)
    assert shebang.startswith("#!lua"), f"{name} must start with its #!lua shebang line, not {shebang!r}"
    return shebang, body


def split_shebang(text: str, name: str) -> tuple[list[str], str]:
    """A script file's flags (from its ``#!lua flags=...`` line) and its body."""
    shebang, body = shebang_and_body(text, name)
    flags = re.search(r"\bflags=(\S+)", shebang)
    return (flags.group(1).split(",") if flags else []), body


def library() -> tuple[str, str]:
    """The library Redis runs (see the module docstring): its name, and its text. Built from the files and values as
    they are now (a test may change a fairness value; its library then has a name of its own)."""
    parts = [shared_text()]
    registered = []
    for name in SCRIPTS:
        flags, body = split_shebang(lua_file(name), name)
        parts.append(f"local function {name}_body()\n{body}\nend")
        registered.append((name, flags))
    text = "\n".join(parts)
    lib = "owlet_" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
    for name, flags in registered:
        flag_list = ", ".join(_lua_string(f) for f in flags)
        text += (f"\nredis.register_function{{function_name = {_lua_string(f'{lib}_{name}')}, "
                 f"callback = function(_, call_argv) begin_call(call_argv) return {name}_body() end, "
                 f"flags = {{{flag_list}}}}}")
    return lib, f"#!lua name={lib}\n{text}"


def compose(text: str, name: str = "script") -> str:
    """A test's own script (its shebang line, then its body) with the prelude and every helper put in between, to run
    as an EVAL script: the body runs after begin_call, as a library function's does."""
    shebang, body = shebang_and_body(text, name)
    return "\n".join([shebang, shared_text(), "begin_call(ARGV)", body])


@dataclass(frozen=True)
class Function:
    """One script of the library: its file's name, and the function name Redis knows it by."""
    name: str
    function: str


class Scripts:
    """The scripts, loaded into the Redis one client talks to, run for one ``Keys`` prefix."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.r, self.keys = r, keys
        self.library, self.source = library()
        for name in SCRIPTS:
            setattr(self, name, Function(name, f"{self.library}_{name}"))
        try:
            self.load()
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # Redis is away: the first call loads it (a page starts, and says so, while Redis is down)

    # the scripts by name, for readers that look them up (set in __init__)
    submit: Function
    pop: Function
    claim: Function
    finish: Function
    requeue: Function
    position: Function
    make_room: Function
    truncate: Function
    adopt_line: Function
    leave: Function

    def load(self) -> None:
        """Load the library into Redis unless it holds it already (under its digest's name, it is this text). A Redis
        that cannot run it (older than 7.0, or a user without the scripting commands) raises ``RedisCannotRunQueue``."""
        try:
            self.r.function_load(self.source)
        except redis.exceptions.NoPermissionError as e:
            raise RedisCannotRunQueue(
                f"the Redis user Owlet logs in as may not load functions ({e}): Owlet runs its queue as a library of "
                "Redis functions; grant that user FUNCTION and FCALL (ACL category +@scripting).") from None
        except redis.exceptions.ResponseError as e:
            if "unknown command" in str(e).lower():
                name, major = _server_version(self.r)
                needs = ("its FUNCTION command was disabled or renamed (rename-command): enable FUNCTION and FCALL"
                         if major >= 7 else "that needs Redis 7.0 or newer (or Valkey 7.2 or newer)")
                raise RedisCannotRunQueue(f"this Redis ({name}) has no FUNCTION command: Owlet runs its queue as a "
                                          f"library of Redis functions, and {needs}.") from None
            if "already exists" not in str(e):
                raise

    def call(self, script: Function, *data: bytes, client=None, settings: str = "", **args):
        """Run ``script`` with ``args`` and the key prefix as its JSON object of named arguments (an argument that
        is None is left out: the script sees nil), ``settings`` (``settings_json``: the deployment's settings the
        script reads, the same text on every call, which Redis decodes once and keeps) and ``data`` as its further
        arguments (raw bytes). ``client``: a pipeline to queue the call on (its reply comes with the pipeline's;
        ``missing_library`` tells the caller to ``load`` and run the pipeline again). A Redis that lost the library
        (it restarted without its data) gets it again, and the call runs again: a call that found no function did
        nothing."""
        named = {"prefix": self.keys.prefix, **{k: v for k, v in args.items() if v is not None}}
        argv = [json.dumps(named, ensure_ascii=False, separators=(",", ":")), settings, *data]
        if client is not None:
            return client.fcall(script.function, 0, *argv)
        try:
            return self.r.fcall(script.function, 0, *argv)
        except redis.exceptions.ResponseError as e:
            if not missing_library(e):
                raise
        self.load()
        return self.r.fcall(script.function, 0, *argv)


class RedisCannotRunQueue(RuntimeError):
    """The Redis cannot run the queue's scripts; the message says why and what to change."""


def _server_version(r: redis.Redis) -> tuple[str, int]:
    """The server as it names itself ("Redis 6.2.14", or Valkey's own name and version) and the major version of
    Redis it is compatible with (0 when unknown)."""
    try:
        info = r.info("server")
    except redis.RedisError:
        return "version unknown", 0
    version = str(info.get("redis_version", ""))
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if info.get("valkey_version"):
        return f"Valkey {info['valkey_version']}", major
    return f"Redis {version or 'of an unknown version'}", major


def settings_json(**settings) -> str:
    """Settings for ``Scripts.call``'s ``settings``: one JSON text, the same for the same values (keys sorted)."""
    return json.dumps(settings, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def missing_library(error: Exception) -> bool:
    """Whether ``error`` is Redis saying it has no such function (it lost the library)."""
    return isinstance(error, redis.exceptions.ResponseError) and "function not found" in str(error).lower()


def _lua_name(name: str) -> str:
    assert name.isidentifier() and name not in _LUA_RESERVED, \
        f"{name!r} cannot name a field of a Lua table"
    return name


def _lua_string(value: str) -> str:
    """A Lua string literal of ``value``'s UTF-8 bytes: printable ASCII as is, anything else as a decimal escape."""
    out = []
    for byte in value.encode("utf-8"):
        char = chr(byte)
        out.append(char if 32 <= byte < 127 and char not in "\"\\" else f"\\{byte:03d}")
    return '"' + "".join(out) + '"'
