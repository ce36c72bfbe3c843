"""The Redis data model is declared once (``worker.store.keys``): the Lua scripts and the Python code use only its names,
what Redis holds matches it, and every script gets exactly the named arguments it reads."""
from __future__ import annotations

import ast
import io
import json
import re
from pathlib import Path

import pytest
import redis
from PIL import Image

from engine.sampling_params import SamplingParams
from tests.redis_server import small_redis, unique_prefix
from worker.client import OwletClient
from worker.config import Settings
from worker.store.history import turn_json
from worker.store.jobs import Message
from worker.store.keys import ConvField, EntryField, JobField, JobState, Keys, SlotsField, StatField, fields_of
from worker.queue import scripts
from worker.queue.job_states import ANSWER_BYTES_PER_TOKEN
from worker.queue.scripts import COMMON, HELPERS, LUA_DIR, SCRIPTS, Scripts, library, lua_file, lua_tables

ROOT = Path(__file__).resolve().parents[2]
DECLARATIONS = (JobField, ConvField, SlotsField, StatField, EntryField, JobState)
HASH_COMMANDS = {"hget", "hmget", "hset", "hsetnx", "hdel", "hexists", "hincrby", "hincrbyfloat"}
# Each script's shebang line: SUBMIT (and LEAVE, which only adds a field) is refused whole by a Redis over maxmemory; the others end, move or read jobs
# already admitted, make room for SUBMIT or only remove (TRUNCATE), and must run then.
SHEBANGS = {"submit": "#!lua", "pop": "#!lua flags=allow-oom", "claim": "#!lua flags=allow-oom",
            "finish": "#!lua flags=allow-oom", "requeue": "#!lua flags=allow-oom",
            "position": "#!lua flags=no-writes,allow-oom", "make_room": "#!lua flags=allow-oom",
            "truncate": "#!lua flags=allow-oom", "adopt_line": "#!lua flags=allow-oom",
            "leave": "#!lua"}


def code_of(name: str) -> str:
    """A Lua file without its comments (no string literal in these files holds "--")."""
    return re.sub(r"--.*$", "", lua_file(name), flags=re.M)


def redis_calls(code: str) -> list[str]:
    """The argument text of every ``redis.call(...)``, nested parentheses included."""
    calls = []
    for match in re.finditer(r"redis\.call\(", code):
        depth, at = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(code[at], 0)
            at += 1
        calls.append(code[match.end():at - 1])
    return calls


def test_the_lua_files_are_the_scripts_and_keep_their_shebangs():
    assert sorted(p.stem for p in LUA_DIR.glob("*.lua")) == sorted([COMMON, *HELPERS, *SCRIPTS])
    assert {name: lua_file(name).split("\n", 1)[0] for name in SCRIPTS} == SHEBANGS
    for helper in (COMMON, *HELPERS):
        assert not lua_file(helper).startswith("#!"), f"{helper}.lua goes after a script's shebang"


def test_the_scripts_use_only_declared_names():
    tables = lua_tables()
    declared_values = {value for name, names in tables.items() if name != "KEY_NAMES" for value in names.values()}
    for name in (COMMON, *HELPERS, *SCRIPTS):
        code = code_of(name)
        for table, field in re.findall(r"\b(KEY|JOB|CONV|SLOTS|STATE|ENTRY)\.(\w+)", code):
            assert field in tables["KEY_NAMES" if table == "KEY" else table], f"{name}.lua uses {table}.{field}, which worker.store.keys does not declare"
        literals = re.findall(r"'([^']*)'", code)
        spelled = sorted(set(literals) & declared_values)
        assert not spelled, f"{name}.lua spells declared names itself: {spelled}"
        for call in redis_calls(code):
            for literal in re.findall(r"'([^']*)'", call):
                assert not re.fullmatch(r"[a-z_][a-z0-9_]*", literal), \
                    f"{name}.lua names a field or key {literal!r} that worker.store.keys does not declare: {call}"
        assert "KEYS[" not in code, f"{name}.lua takes its keys from the KEY table, not KEYS"
        assert "ARGV" not in code, f"{name}.lua reads its arguments from args and argv (a library function has no ARGV)"
        argv = set(re.findall(r"\bargv\[(\d+)\]", code))
        assert argv <= ({"3"} if name == "submit" else set()), (name, argv)  # argv[2] is the settings (common.lua)


def test_every_declared_name_is_used():
    lua = "\n".join(code_of(name) for name in (COMMON, *HELPERS, *SCRIPTS))
    python = "\n".join(p.read_text() for p in (ROOT / "worker").rglob("*.py"))
    by_table = {cls: table for table, cls in scripts.LUA_TABLES.items()}
    for cls in DECLARATIONS:
        for name in fields_of(cls):
            used_in_lua = cls in by_table and re.search(rf"\b{by_table[cls]}\.{name}\b", lua)
            used_in_python = re.search(rf"\b{cls.__name__}\.{name}\b", python)
            assert used_in_lua or used_in_python, f"{cls.__name__}.{name} is declared but nothing reads or writes it"
    for name in Keys("p:").for_scripts():
        assert re.search(rf"\bKEY\.{name}\b", lua), f"KEY.{name} is given to the scripts but none uses it"


def test_python_reads_and_writes_hash_fields_through_the_declaration():
    """No ``r.hget(key, "state")``: a field name written out in Python could be renamed in one place only."""
    stray = []
    for path in [*(ROOT / "worker").rglob("*.py"), *(ROOT / "ui").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in HASH_COMMANDS):
                continue
            fields = [*node.args[1:], *(k.value for k in node.keywords if k.arg == "mapping")]
            fields += [key for arg in fields if isinstance(arg, ast.Dict) for key in arg.keys]
            if any(isinstance(f, ast.Constant) and isinstance(f.value, str) for f in fields):
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not stray, f"hash fields spelled out instead of named through worker.store.keys: {stray}"


def tiny_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def hash_fields(r, key) -> set[str]:
    return {f.decode() for f in r.hkeys(key)}


def test_what_redis_holds_is_what_the_model_declares(client, fake_capacity):
    """A job through its whole life, a lost worker's requeue, affinity counters: every hash field and stream entry
    field Redis then holds is a declared one."""
    conv = client.new_conversation("ann")
    r, keys = client.r, client.keys
    job = client.submit("ann", conv, "hi", image=tiny_png(), notify=keys.started_notices("page1")).job  # as the page
    # submits, about a picture (so it holds the picture's field too)
    assert hash_fields(r, keys.job(job)) <= set(fields_of(JobField).values())
    assert hash_fields(r, keys.conversation(conv)) == {ConvField.user, ConvField.created, ConvField.pending,
                                                        ConvField.chars, ConvField.images}
    fake_capacity(4, name="w@x")
    assert client.dispatch() == 1
    n = int(r.hget(keys.job(job), JobField.dispatch_n))
    assert client.jobs.claim(job, n, "w@x")
    assert client.jobs.requeue(job, "lost") == 1  # the worker was lost: queued again, at the front
    assert client.dispatch() == 1
    assert client.jobs.claim(job, n + 1, "w@x")
    assert client.jobs.finish(job, JobState.done, answer_turn=json.dumps({"role": "assistant", "text": "hello",
                                                                          "image_sha": None, "job_id": job}),
                              holder="w@x", service_s=1.5, text="hello")
    assert hash_fields(r, keys.job(job)) == set(fields_of(JobField).values()), "a job that ran has every field"
    assert r.hget(keys.job(job), JobField.state).decode() == JobState.done
    assert hash_fields(r, keys.conversation(conv)) == {ConvField.user, ConvField.created, ConvField.chars,
                                                        ConvField.images}, "nothing pending"
    assert hash_fields(r, keys.slots) == set(fields_of(SlotsField).values())
    notices = r.xrange(keys.started_notices("page1"))
    assert [fields for _, fields in notices] == [{EntryField.data.encode(): job.encode()}] * 2, \
        "each start is announced to the page that follows the job"
    follow_up = client.submit_turn("ann", conv, "and then?")  # dispatched at once, to the holder's queue
    assert client.job_state(follow_up) == JobState.dispatched
    assert client.r.hget(keys.job(follow_up), JobField.target) == b"w@x"
    client.jobs.cancel(follow_up)
    assert hash_fields(r, keys.stats) <= set(fields_of(StatField).values())
    assert r.hget(keys.stats, StatField.affinity_hits) == b"1"
    entries = r.xrange(keys.stream(job))
    assert [e[EntryField.type.encode()].decode() for _, e in entries] == ["queued", "started", "queued", "started",
                                                                          "done"]
    assert all(set(e) == {EntryField.type.encode(), EntryField.data.encode()} for _, e in entries)


def test_every_script_gets_exactly_the_named_arguments_it_reads(client, fake_capacity, monkeypatch):
    passed: dict[str, set[str]] = {}
    real_call = Scripts.call

    def recording_call(self, script, *data, client=None, settings="", **args):
        passed.setdefault(script.name, set()).update(k for k, v in args.items() if v is not None)
        passed[script.name].update(json.loads(settings) if settings else ())  # read the same way (common.lua)
        return real_call(self, script, *data, client=client, settings=settings, **args)

    monkeypatch.setattr(Scripts, "call", recording_call)
    fake_capacity(2)
    job = client.submit_turn("ann", client.new_conversation("ann"), "hi")  # SUBMIT, and POP in the dispatch
    client.queue_position(job)
    n = int(client.r.hget(client.keys.job(job), JobField.dispatch_n))
    client.jobs.claim(job, n, "w@x")
    client.jobs.requeue(job, "lost", only_state="dispatched")  # REQUEUE as a sweep acts: nothing (it started)
    client.jobs.requeue(job, "lost", only_worker="w@x")
    client.queue_position(job)  # POSITION
    client.jobs.cancel(job)  # FINISH
    # a stateless client's turns: a new conversation with earlier turns (history), then a follow-up (expect_turns)
    asked = [Message("user", "hi"), Message("assistant", "hello"), Message("user", "and?")]
    first = client.submit_messages("bea", asked)
    client.jobs.finish(first.job, "done", answer_turn=turn_json("assistant", "fine", job_id=first.job), service_s=0.5)
    client.submit_messages("bea", asked + [Message("assistant", "fine"), Message("user", "more?")])
    client.submit("cy", None, "a new conversation, the page's way",  # SUBMIT with newest, and the page's notices
                  notify=client.keys.started_notices("page1"))
    client.jobs.make_room()  # MAKE_ROOM
    client.truncate("bea", first.conv, 2)  # TRUNCATE
    client.jobs.adopt_line()  # ADOPT_LINE
    client.leave("bea", first.conv, 1.5)  # LEAVE
    client.jobs.take(4, 2, "w@x")  # POP with its worker: a worker taking its next job itself
    taken = client.submit_turn("cid", client.new_conversation("cid"), "hi")
    client.jobs.finish_and_take(taken, "cancelled", take=(4, 2, "w@x"), tail="par")  # FINISH taking the freed slot
    assert set(passed) == set(SCRIPTS)
    for name in SCRIPTS:
        reads = set(re.findall(r"\bargs\.(\w+)", code_of(name)))
        assert set(re.findall(r"\bargs\.(\w+)", code_of(COMMON))) == {"prefix"}, "Scripts.call adds the prefix"
        assert passed[name] == reads, f"{name}: passed but not read {passed[name] - reads}, " \
                                      f"read but not passed {reads - passed[name]}"


def test_any_prefix_and_any_text_reach_the_scripts_unchanged(redis_url):
    """The key prefix and the arguments travel as JSON: quotes, backslashes, newlines and non-ASCII characters come
    through byte for byte, in key names and in stored text. The scripts' library is the same for every prefix, so
    Redis holds one copy of it however many prefixes share it."""
    prefix = unique_prefix("dm") + 'é"\\\n\'x:'
    settings = Settings.from_env(redis_url=redis_url, key_prefix=prefix)
    client = OwletClient(settings=settings)
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"  # the prefix, glob characters escaped
    try:
        text = 'a "quote", a \\ backslash, a \u0000 NUL, an emoji \U0001F989 and ü'
        conv = client.new_conversation("ann")
        job = client.submit_turn("ann", conv, text)
        assert client.history("ann", conv)[0]["text"] == text
        stored = client.r.hget(client.keys.job(job), JobField.payload).decode()
        assert json.loads(stored)["messages"][-1]["text"] == text
        charged = int(client.r.get(client.keys.user_text_quota("ann")))
        turn = client.r.lindex(client.keys.turns(conv), 0)
        answer = SamplingParams.from_dict({}).max_new_tokens * ANSWER_BYTES_PER_TOKEN
        assert charged == len(stored.encode()) + len(turn) + answer, "bytes charged are the bytes stored"
        assert client.queue_position(job) == 1
        assert client.jobs.pop(1)[0] == job
        names = {k.decode() for k in client.r.scan_iter(match=pattern)}
        assert client.keys.job(job) in names and client.keys.inflight in names
        assert all(name.startswith(prefix) for name in names)
        assert client.jobs._scripts.submit == Scripts(client.r, Keys("another:")).submit
        assert len(client.r.function_list(library=library()[0])) == 1
    finally:
        leftover = list(client.r.scan_iter(match=pattern))
        if leftover:
            client.r.delete(*leftover)
        client.close()


def test_a_full_redis_still_moves_and_ends_admitted_jobs(tmp_path):
    """Over maxmemory, Redis refuses SUBMIT whole (``#!lua``), while POP, CLAIM, REQUEUE, POSITION and FINISH
    (``allow-oom``) still run, so no admitted job is stranded."""
    from worker.errors import ServiceBusy

    with small_redis(tmp_path) as url:
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix="oom:"))
        first = client.submit_turn("ann", client.new_conversation("ann"), "before it filled up")
        second = client.submit_turn("bob", client.new_conversation("bob"), "also before")
        full = redis.Redis.from_url(url)
        for i in range(8):
            full.set(f"filler:{i}", b"x" * 200_000)
        # a limit well under what is held: over it by far more than any one command's arguments
        full.config_set("maxmemory", int(full.info("memory")["used_memory"]) - 1_000_000)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            full.set("one:more", b"x")
        with pytest.raises(ServiceBusy):
            client.submit("cy", None, "a new conversation, refused whole")
        assert client.queue_position(second) == 2
        job, n, _ = client.jobs.pop(4)
        assert job == first and client.jobs.claim(job, n, "w@x")
        assert client.jobs.requeue(job, "lost") == 1
        assert client.jobs.finish(job, JobState.error, message="ended")
        assert client.jobs.cancel(second) and client.job_state(second) == JobState.cancelled
        assert not full.exists(client.keys.newest_conversation("cy")), "nothing of the refused turn"
        client.close()
        full.close()
