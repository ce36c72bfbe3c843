"""``python -m ui``: serve the Owlet chat page.

    python -m ui [--host 0.0.0.0] [--port 7860] [--share] [--auth user:pass ...] [--redis-url URL]

Flags override ``OWLET_UI_*`` / ``REDIS_URL`` environment variables (see ``ui.config``).
"""
from __future__ import annotations

import argparse
import logging
import sys

from ui.config import UIConfig, parse_auth


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ui", description="Serve the Owlet image-chat page.")
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
        raise SystemExit(f"python -m ui: {exc}") from None
    return UIConfig.from_env(environ).with_overrides(host=args.host, port=args.port, share=args.share,
                                                     auth=auth, redis_url=args.redis_url)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up probes, one line each
    config = config_from_args(parse_args(argv))
    from ui.server import serve  # heavy imports (gradio) only once the arguments are known to be good

    serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
