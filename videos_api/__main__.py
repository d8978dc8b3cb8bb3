"""`python -m videos_api`: serve the Videos API and its page with uvicorn.

    python -m videos_api [--triton-url HOST:PORT] [--host ADDR] [--port P] [--data-dir DIR]
                         [--api-key-file FILE] [--cors-origin ORIGIN]... [--max-body-bytes N]
                         [--max-upload-bytes N] [--retention-hours H] [--max-attempts N]
                         [--accept-wait SECONDS] [--recover-wait SECONDS]
                         [--allow-url-host HOST]... [--allow-private-urls] [--model-name NAME]

Bad flags exit with status 2 and one error line (argparse), before anything is served.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from client.api import check_url
from h3_core.request_model import UrlPolicy

from .app import Settings, create_app
from .auth import parse_key_file


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    defaults = Settings()
    p = argparse.ArgumentParser(
        prog="python -m videos_api", description="Serve an OpenAI-compatible Videos API in front of Triton."
    )
    p.add_argument(
        "--triton-url",
        default=os.environ.get("H3_GRPC_URL", defaults.triton_url),
        help="Triton's gRPC endpoint, host:port (default: $H3_GRPC_URL, set by server.launch --then, else %(default)s)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default: %(default)s)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=defaults.data_dir,
        help="the jobs database (jobs.sqlite3) and the videos/ folder (default: %(default)s)",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        help="a UTF-8 file of API keys, one a line, 'KEY' or 'KEY admin': every /v1 route then needs "
        "Authorization: Bearer KEY, and a key sees only its own jobs unless marked admin",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow this origin by CORS (repeatable; default: CORS off)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=_positive(int),
        default=defaults.max_body_bytes,
        help="largest POST body in bytes, other than a create (default: %(default)s)",
    )
    p.add_argument(
        "--max-upload-bytes",
        type=_positive(int),
        default=defaults.max_upload_bytes,
        help="largest POST /v1/videos (and /sync) body in bytes, multipart or JSON, its files included "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--retention-hours",
        type=_positive(float),
        default=defaults.retention_s / 3600,
        help="hours an ended job and its files are kept (default: %(default)s)",
    )
    p.add_argument(
        "--max-attempts",
        type=_positive(int),
        default=defaults.max_attempts,
        help="submissions of a job across front-end restarts before it is failed (default: %(default)s)",
    )
    p.add_argument(
        "--accept-wait",
        type=_positive(float),
        default=defaults.accept_wait_s,
        metavar="SECONDS",
        help="longest wait of a create for Triton's first answer (default: %(default)s)",
    )
    p.add_argument(
        "--recover-wait",
        type=_positive(float),
        default=defaults.recover_wait_s,
        metavar="SECONDS",
        help="longest wait at start-up for Triton to be ready before jobs left running by the previous "
        "front end are resubmitted or failed (default: %(default)s)",
    )
    p.add_argument(
        "--allow-url-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a host an SGLang request's http(s) uri may name (repeatable; default: no URL is fetched)",
    )
    p.add_argument(
        "--allow-private-urls",
        action="store_true",
        help="let allowed hosts resolve to private, loopback or link-local addresses (default: refused)",
    )
    p.add_argument(
        "--model-name", default=defaults.model_name, help="the model field answered to (default: %(default)s)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and serve until SIGINT/SIGTERM; returns 0. Bad flags,
    an unreadable, malformed (auth.parse_key_file) or empty key file exit with status 2."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        check_url(args.triton_url)
    except ValueError as error:
        parser.error(f"--triton-url: {error}")
    if not 1 <= args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    keys = {}
    if args.api_key_file is not None:
        try:
            keys = parse_key_file(args.api_key_file.read_bytes())
        except (OSError, ValueError) as error:
            parser.error(f"--api-key-file: {error}")
        if not keys:
            parser.error(f"--api-key-file {args.api_key_file} holds no key")
    settings = Settings(
        triton_url=args.triton_url,
        data_dir=args.data_dir,
        api_keys=keys,
        cors_origins=tuple(args.cors_origin),
        max_body_bytes=args.max_body_bytes,
        max_upload_bytes=args.max_upload_bytes,
        retention_s=args.retention_hours * 3600,
        max_attempts=args.max_attempts,
        accept_wait_s=args.accept_wait,
        recover_wait_s=args.recover_wait,
        model_name=args.model_name,
        url_policy=UrlPolicy(hosts=frozenset(args.allow_url_host), allow_private=args.allow_private_urls),
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    print(
        f"[videos_api] the page: http://{args.host}:{args.port}/  API: http://{args.host}:{args.port}/v1  "
        f"Triton: {args.triton_url}  data: {args.data_dir}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
