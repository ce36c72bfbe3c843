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
(``HELPERS``). What Redis runs is put together when ``Scripts`` is built:

    the script file's shebang line
    a prelude written here: the data model's names from ``worker.store.keys`` as the Lua tables KEY (key names and
        prefixes, without the key prefix), JOB, CONV, SLOTS, STATE and ENTRY, and TURNS_SUFFIX; the values of
        ``worker.queue.fairness`` as HALF_LIFE, USAGE_WEIGHT and USAGE_CAP; and the history budget's charges from
        ``worker.store.memory_model`` as CONV_BYTES, TURN_BYTES, INDEX_BYTES and CLEARED_BYTES
    common.lua (which decodes the named arguments, and puts the key prefix in front of KEY's names)
    the helpers: usage.lua (a group's recent use), budgets.lua (pictures and history), line.lua (the fair line),
        lifecycle.lua (a job starts and ends), dispatch.lua (POP's step)
    the rest of the script file

A script takes one JSON object of named arguments as ARGV[1] (its file's header lists them, and ``Scripts.call``
adds the key prefix as ``prefix``); SUBMIT also takes the bytes of an image sent with the turn as ARGV[2], which
JSON cannot carry. No script takes KEYS: Owlet runs on one Redis (not a cluster), and every key a script touches
is a name or prefix from KEY. The scripts' text does not depend on the prefix, so Redis caches one copy of each.

The shebang lines decide what a full Redis may still run: SUBMIT's bare ``#!lua`` makes Redis refuse it whole
when it is over maxmemory (nothing is half-written); the scripts that end or move jobs
already admitted carry ``allow-oom``, so a full Redis never strands a job; so does MAKE_ROOM, which clears old
conversations and pictures when SUBMIT was refused that way, before it is asked again.
"""
from __future__ import annotations

import json
from pathlib import Path

import redis

from worker.store import memory_model
from worker.store.keys import TURNS_SUFFIX, ConvField, EntryField, JobField, JobState, Keys, SlotsField, fields_of
from worker.queue.fairness import GROUP_USAGE_CAP_S, GROUP_USAGE_HALF_LIFE_S, GROUP_USAGE_WEIGHT

LUA_DIR = Path(__file__).with_name("lua")
COMMON = "common"
# The helper files, in the order each may use those before it.
HELPERS = ("usage", "budgets", "line", "lifecycle", "dispatch")
SCRIPTS = ("submit", "pop", "claim", "finish", "requeue", "position", "make_room", "adopt_line")
# The data model's declarations, by the name of the Lua table that carries each (besides KEY).
LUA_TABLES = {"JOB": JobField, "CONV": ConvField, "SLOTS": SlotsField, "STATE": JobState, "ENTRY": EntryField}
_LUA_RESERVED = frozenset("and break do else elseif end false for function if in local nil not or repeat return "
                          "then true until while".split())


def lua_file(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def lua_tables() -> dict[str, dict[str, str]]:
    """Every table the prelude defines, by its Lua name: KEY (the key names for the prefix ""), and the hash and
    state declarations."""
    return {"KEY": Keys("").for_scripts(), **{name: fields_of(cls) for name, cls in LUA_TABLES.items()}}


def prelude() -> str:
    """The Lua that defines the data model's names and the fairness values for one script."""
    lines = ["-- written by worker.queue.scripts from worker.store.keys and worker.queue.fairness"]
    for table, names in lua_tables().items():
        entries = ", ".join(f"{_lua_name(name)} = {_lua_string(value)}" for name, value in names.items())
        lines.append(f"local {table} = {{{entries}}}")
    lines.append(f"local TURNS_SUFFIX = {_lua_string(TURNS_SUFFIX)}")
    lines.append(f"local CONV_BYTES, TURN_BYTES, INDEX_BYTES, CLEARED_BYTES = {memory_model.CONVERSATION_BYTES}, "
                 f"{memory_model.TURN_BYTES}, {memory_model.INDEX_ENTRY_BYTES}, {memory_model.CLEARED_BYTES}")
    lines.append(f"local HALF_LIFE, USAGE_WEIGHT, USAGE_CAP = "
                 f"{GROUP_USAGE_HALF_LIFE_S!r}, {GROUP_USAGE_WEIGHT!r}, {GROUP_USAGE_CAP_S!r}")
    return "\n".join(lines)


def script_source(name: str) -> str:
    """The text Redis runs for script ``name`` (see the module docstring)."""
    return compose(lua_file(name), name)


def compose(text: str, name: str = "script") -> str:
    """A script's text (its shebang line, then its body) with the prelude and every helper put in between."""
    shebang, body = text.split("\n", 1)
    assert shebang.startswith("#!lua"), f"{name} must start with its #!lua shebang line, not {shebang!r}"
    return "\n".join([shebang, prelude(), lua_file(COMMON), *(lua_file(h) for h in HELPERS), body])


class Scripts:
    """The scripts, registered with one Redis client, run for one ``Keys`` prefix."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.keys = keys
        self.submit = r.register_script(script_source("submit"))
        self.pop = r.register_script(script_source("pop"))
        self.claim = r.register_script(script_source("claim"))
        self.finish = r.register_script(script_source("finish"))
        self.requeue = r.register_script(script_source("requeue"))
        self.position = r.register_script(script_source("position"))
        self.make_room = r.register_script(script_source("make_room"))
        self.adopt_line = r.register_script(script_source("adopt_line"))

    def call(self, script, *data: bytes, client=None, **args):
        """Run ``script`` with ``args`` and the key prefix as its JSON object of named arguments (an argument that
        is None is left out: the script sees nil), and ``data`` as ARGV[2], ... (raw bytes). ``client``: a pipeline
        to queue the call on (its reply comes with the pipeline's)."""
        named = {"prefix": self.keys.prefix, **{k: v for k, v in args.items() if v is not None}}
        return script(keys=[], args=[json.dumps(named, ensure_ascii=False, separators=(",", ":")), *data],
                      client=client)


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
