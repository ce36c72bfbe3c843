"""Ask one question about an image from the command line, streaming the answer.

    python -m engine --model models/owlet-shapes-vl --image scene.png "What colour is the circle?"

Follow-up questions on stdin reuse the conversation's cache (an empty line quits).
"""
from __future__ import annotations

import argparse
import io
import logging
import sys
from pathlib import Path

from PIL import Image, UnidentifiedImageError



def read_picture(path: str, ap: argparse.ArgumentParser) -> bytes:
    """The picture file's bytes, or the parser's error (exit 2) saying why it cannot be one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        ap.error(f"--image {path}: {exc.strerror or exc}")
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except UnidentifiedImageError:
        ap.error(f"--image {path}: not a picture (no image format recognised in it)")
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for a damaged picture
        ap.error(f"--image {path}: a damaged picture ({type(exc).__name__}: {exc})")
    return data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question")
    ap.add_argument("--model", help="checkpoint folder (default: $OWLET_MODEL)")
    ap.add_argument("--image", help="image file to ask about")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--interactive", action="store_true", help="read follow-up questions from stdin")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    picture = read_picture(args.image, ap) if args.image else None  # before the model loads: a typo fails at once
    from . import EngineConfig, LLMEngine, SamplingParams  # torch and transformers: seconds to import

    overrides = {"model": args.model} if args.model else {}
    try:
        engine = LLMEngine(EngineConfig.from_env(**overrides)).start()
    except ValueError as exc:
        ap.error(str(exc))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    content = [{"type": "text", "text": args.question}]
    if picture is not None:  # its bytes: the engine's own checks (format, size, decompression bombs) apply
        content.insert(0, {"type": "image", "image": picture})
    messages = [{"role": "user", "content": content}]
    try:
        while True:
            try:
                handle = engine.add_request(messages, params, session_id="cli")
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            for delta in handle:
                print(delta, end="", flush=True)
            result = handle.result()
            s = result.stats
            print(f"\n[{result.finish_reason.value}; {s.prompt_tokens} prompt tokens, {s.cached_tokens} cached, "
                  f"TTFT {s.ttft_s or 0:.3f}s]", file=sys.stderr)
            if not args.interactive:
                return 0
            messages.append({"role": "assistant", "content": result.text})
            question = input("> ").strip()
            if not question:
                return 0
            messages.append({"role": "user", "content": question})
    finally:
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
