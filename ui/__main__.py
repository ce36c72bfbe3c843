"""``python -m ui``: serve the Owlet chat page.

    owlet-page [--host 0.0.0.0] [--port 7860] [--share] [--auth user:pass ...] [--redis-url URL]
    python -m ui ...                       (the same)

Flags override ``OWLET_UI_*`` / ``REDIS_URL`` environment variables (see ``ui.config``). A bad flag, a bad
setting, or a Redis URL that is malformed or does not answer ends the page at once with a message and a
non-zero exit (2: bad flag or setting; 1: Redis unreachable or unable to run the queue's functions, the port not
available, or a Gradio whose internals do not fit Owlet's adaptations of them: ``ui.gradio_adapters.registry``);
once serving, the page rides out Redis restarts.
"""
from __future__ import annotations

import argparse
import logging
import sys

from owlet.redis_url import without_password
from owlet.setting_names import warn_unread
from owlet.settings import SettingError
from ui.config import UIConfig, parse_auth

PROG = "owlet-page"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description="Serve the Owlet image-chat page.")
    parser.add_argument("--host", help="interface to bind (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", default=None,
                        help="also ask Gradio for a public link (needs internet; otherwise serves locally)")
    parser.add_argument("--auth", action="append", metavar="USER:PASS",
                        help="require a login; repeat for several users")
    parser.add_argument("--redis-url", help="Redis holding Owlet's queues (default $REDIS_URL)")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace, environ=None) -> UIConfig:
    try:
        auth = parse_auth(args.auth) if args.auth else None
    except ValueError as exc:
        raise SystemExit(f"{PROG}: {exc}") from None
    return UIConfig.from_env(environ).with_overrides(host=args.host, port=args.port, share=args.share,
                                                     auth=auth, redis_url=args.redis_url)


def check_redis(url: str) -> tuple[int, str] | None:
    """``(exit code, why)`` when ``url`` is malformed (2) or does not answer (1); None when a PING succeeds."""
    import redis

    shown = without_password(url)
    try:
        client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    except ValueError as exc:
        return 2, f"the Redis URL {shown!r} is malformed: {exc}"
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        return 1, (f"the Redis at {shown} refused the login ({str(exc).rstrip('.')}): check the user and password "
                   "in --redis-url / REDIS_URL.")
    except (redis.RedisError, OSError) as exc:
        return 1, (f"no Redis answers at {shown}: {str(exc).rstrip('.')}. Start Redis or pass --redis-url / set "
                   "REDIS_URL.")
    finally:
        client.close()
    return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up probes, one line each
    warn_unread(logging.getLogger(PROG))  # a misspelt or renamed OWLET_* variable would otherwise pass unnoticed
    try:
        config = config_from_args(parse_args(argv))
        from worker.config import Settings

        Settings.from_env()  # the queue's settings the page reads too (OWLET_USER_QUEUE_CAP, ...): checked here, once
    except (SettingError, ValueError, AssertionError) as exc:
        print(f"{PROG}: bad setting: {exc}", file=sys.stderr, flush=True)
        return 2
    except SystemExit as exc:  # a bad flag value; argparse's own exits (int codes) pass through unchanged
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr, flush=True)
        return 2
    problem = check_redis(config.redis_url)
    if problem:
        code, why = problem
        print(f"{PROG}: {why}", file=sys.stderr, flush=True)
        return code
    from ui.gradio_adapters.registry import GradioNotVerified
    from ui.ops.launch import PageNotServed
    from ui.server import serve  # heavy imports (gradio) only once the arguments are known to be good
    from worker.queue.scripts import RedisCannotRunQueue

    try:
        serve(config)
    except (PageNotServed, GradioNotVerified, RedisCannotRunQueue) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def run() -> None:
    """Console-script entry point (``owlet-page``)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
