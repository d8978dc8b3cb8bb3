"""Generate a clip with sound from a prompt through a running tritonserver.

    python -m client.generate --prompt "a red ball rolls to the left" --out out/clip.mp4
    python -m client.generate --prompt "it rolls away" --out out/fl.mp4 --first-frame a.png --last-frame b.png
    python -m client.generate --prompt "she waves and says hello" --out out/ref.mp4 \
        --reference-image woman.png --reference-audio voice.wav --guide wave.png@40
    python -m client.generate --request req.json --out out/clip.mp4   # SGLang's H3 JSON request

--request takes a file of SGLang's H3 JSON ({task, prompt, conditions, target, seed,
num_inference_steps}: h3_core.request_model.read_sglang; its uris data: URLs, its steps sigma
points, N - 1 forwards) instead of --prompt and the request's other flags.

The server's gRPC endpoint comes from --url, else $H3_GRPC_URL, else 127.0.0.1:8001. A progress
bar follows the denoise steps. Exit status: 0 written, 1 the server refused or failed the request
or a timeout expired, 2 bad flags (the usage and one error line on stderr, no traceback, nothing
sent), 130 stopped with Ctrl-C.

Ctrl-C (SIGINT) is noticed from this module's first statements (a handler of the interpreter's own
_signal module, before any import), while its imports load too, and never raises KeyboardInterrupt
(no traceback); only a Ctrl-C while Python itself starts, before the module runs, gets Python's
default. The program ends with one line:
  before the request was sent: "interrupted before the request was sent" (status 130);
  while the request runs: it cancels the request on the server by its id and waits up to
    STOP_WAIT_S seconds for the request's final response: "cancelled on the server: <the
    server's message>" (130), or else "could not cancel request <id> on the server: <error>" or
    "no final response for request <id> ..." (130); when the cancel answers "unknown" (the
    request had not reached the DiT, e.g. queued behind a request-mode generation: the server
    ends it with CANCELLED when it does) at once "cancelled before it started: ..." (130);
  a failure of the client itself (not the server's): "error: UNKNOWN: the client failed: ..." (1);
  a result that arrives all the same (Ctrl-C while the request's clip was decoded) or had arrived
    is written: "the result arrived; wrote ..." (0); Ctrl-C after that line changes nothing.
The program closes every gRPC client and stream it opened and leaves with os._exit, skipping the
interpreter's shutdown (which would close channels from finalizers and join the thread of a
stream still open, either of which can block for ever), and the first Ctrl-C starts a watchdog
that ends the process with status 130 HARD_EXIT_S later, whatever it is doing then.
"""

# ruff: noqa: E402
# (the SIGINT handler is installed before the heavy imports, which take a second or more)

import _signal  # signal's C module, loaded with the interpreter: no import runs before the handler

EARLY_SIGINT: list[int] = []  # Ctrl-C before on_sigint was installed (the next few imports)

if __name__ == "__main__":
    _signal.signal(_signal.SIGINT, lambda signum, frame: EARLY_SIGINT.append(signum))

import os
import signal
import sys
import threading

STOP_WAIT_S = 30.0  # after Ctrl-C: the longest wait for the final response (a step boundary, or a decode)
HARD_EXIT_S = STOP_WAIT_S + 15.0  # after the first Ctrl-C: the process ends by then, whatever it is doing
INTERRUPTED = threading.Event()  # set by Ctrl-C when run as a program (on_sigint)


def hard_exit() -> None:
    """End the process at once with status 130, saying so on stderr (on_sigint's watchdog)."""
    print(f"exiting: still not stopped {HARD_EXIT_S:g} s after Ctrl-C", file=sys.stderr, flush=True)
    os._exit(130)


def on_sigint(signum, frame) -> None:
    """The program's SIGINT handler: the first Ctrl-C sets INTERRUPTED (main() then stops the
    request) and starts a daemon thread that calls hard_exit() HARD_EXIT_S seconds later; later
    ones change nothing."""
    if not INTERRUPTED.is_set():
        INTERRUPTED.set()
        watchdog = threading.Timer(HARD_EXIT_S, hard_exit)
        watchdog.daemon = True
        watchdog.start()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, on_sigint)
    if EARLY_SIGINT:
        on_sigint(signal.SIGINT, None)

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from tqdm import tqdm

from h3_core import protocol, request_model, rules
from h3_core.media import encode_wav

from .api import CANCEL_WAIT_S, DEADLINE_MARGIN_S, H3Client, H3Error, check_url, media_bytes


def numbered(path: Path, count: int) -> list[Path]:
    """The file of each output: `path` for one output; <stem>-<k><suffix> for output k of several."""
    return [path] if count == 1 else [path.with_name(f"{path.stem}-{k}{path.suffix}") for k in range(count)]


def check_writable(flag: str, path: Path, folder: bool = False) -> None:
    """Raise ValueError naming the flag unless `path` (a file, or a folder when `folder`) can be
    written: it is of the right kind if it exists, and a file can be made in it or in its nearest
    existing parent (tried with a temporary file, removed at once; missing folders are made when
    writing)."""
    if path.exists() and path.is_dir() != folder:
        kind, wanted = ("file", "folder") if folder else ("folder", "file")
        raise ValueError(f"{flag} {path} is a {kind}; give a {wanted} path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path}: cannot write it (Permission denied)")
    parent = path if folder else path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: {parent} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {path}: cannot write in {parent} ({error.strerror})") from None


def flag_type(rule, allowed: str | None = None):
    """An argparse type: rule(text), a flag's value by h3_core.rules' field rules, refused when the
    rule raises ValueError with "must be <allowed>, got <text>", or without `allowed` with the
    rule's own words ("must be a number of seconds > 0, got 'nan'"); the rule's error is the
    ArgumentTypeError's cause."""

    def parse(text: str):
        try:
            return rule(text)
        except ValueError as error:
            words = f"must be {allowed}" if allowed is not None else error.reason
            raise argparse.ArgumentTypeError(f"{words}, got {text!r}") from error

    return parse


def whole(low: int):
    """The rule of an integer flag >= low: rules.check_integer (digits) and rules.check_at_least."""
    return lambda text: rules.check_at_least("flag", rules.check_integer("flag", text, text=True), low)


def non_empty(text: str) -> str:
    """`text`; ValueError when it is empty."""
    if not text:
        raise ValueError("empty")
    return text


POSITIVE = flag_type(whole(1), "an integer >= 1")
NON_NEGATIVE = flag_type(whole(0), "an integer >= 0")
SECONDS = flag_type(lambda text: rules.check_seconds("flag", text, text=True))  # its words: MUST_BE_SECONDS
REQUEST_ID = flag_type(non_empty, "a non-empty string")
SHIFT = flag_type(
    lambda text: rules.check_flow_shift("flag", rules.check_number("flag", text, text=True)),
    f"a number from {protocol.MIN_FLOW_SHIFT:g} to {protocol.MAX_FLOW_SHIFT:g}",
)
LORA = flag_type(  # one adapter, (name, scale), by the one rule (rules.lora_list)
    lambda text: protocol.lora_list([text])[0],
    f"NAME[:SCALE], NAME {protocol.LORA_NAME_RULE} and SCALE a number in "
    f"-{protocol.LORA_SCALE_MAX:g}..{protocol.LORA_SCALE_MAX:g}",
)
CACHE_THRESHOLD = flag_type(lambda text: rules.check_number("flag", text, text=True, low=0))  # "a finite number >= 0"


def image_at_frame(text: str) -> tuple[Path, int]:
    """IMAGE@FRAME (a --guide value) -> (Path(IMAGE), FRAME), split at the last "@" (a path may hold
    one); raises ValueError without a non-empty IMAGE, an "@" and an integer FRAME."""
    image, at, frame = text.rpartition("@")
    if not (image and at):
        raise ValueError(f"no IMAGE@ in {text!r}")
    return Path(image), rules.check_integer("FRAME", frame, text=True)


def guide_at(text: str) -> tuple[Path, int]:
    """image_at_frame(text) with FRAME >= 0 (rules.check_at_least)."""
    image, frame = image_at_frame(text)
    return image, rules.check_at_least("FRAME", frame, 0)


GUIDE = flag_type(guide_at, "IMAGE@FRAME with FRAME an integer >= 0")


def url_type(text: str) -> str:
    """argparse type of --url: host:port, dns:///host:port or ipv4: / ipv6: lists (api.check_url)."""
    try:
        return check_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked before anything is sent; bad ones end with exit status 2. The files of
    --first-frame / --last-frame / --reference-* / --guide are read here: args.first_frame /
    args.last_frame hold their bytes (api.media_bytes) or None, args.reference_images /
    reference_videos / reference_audio lists of bytes and args.guides (bytes, frame) pairs, in the
    flags' order."""
    parser = argparse.ArgumentParser(prog="python -m client.generate", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--prompt", help="the prompt (required unless --request)")
    add("--request", type=Path, metavar="JSON", help="a file of SGLang's H3 JSON request (instead of --prompt ...)")
    add(
        "--out",
        type=Path,
        required=True,
        help="output .mp4 path (with --num-outputs N > 1: <stem>-<k>.mp4 for k = 0..N-1)",
    )
    add("--wav", type=Path, help="also write the audio as a .wav file (numbered like --out)")
    add("--height", type=POSITIVE, metavar="PIXELS", help="a multiple of 32 (the server's default when left out)")
    add("--width", type=POSITIVE, metavar="PIXELS", help="a multiple of 32")
    add("--num-frames", type=POSITIVE, metavar="N", help=f"frames at {protocol.VIDEO_FPS} fps")
    add("--steps", type=POSITIVE, metavar="N", help="number of denoise steps (DiT forwards)")
    add("--seed", type=NON_NEGATIVE, metavar="N", help="output k uses seed + k (random when left out)")
    add("--num-outputs", type=POSITIVE, default=1, metavar="N", help="clips from one request (default 1)")
    add(
        "--preview-dir",
        type=Path,
        metavar="DIR",
        help="write the previews as DIR/step-<k>.npy (uint8 [h, w, 3], p px per latent cell)",
    )
    add("--preview-every", type=POSITIVE, metavar="N", help="a preview after every N steps (default 1)")
    add(
        "--deadline",
        type=SECONDS,
        metavar="SECONDS",
        help="the server cancels the request this long after its arrival (request parameter deadline_s)",
    )
    add("--priority", type=int, default=0, metavar="N", help="request_priority: higher runs first (default 0)")
    add("--request-id", type=REQUEST_ID, metavar="ID", help="the request's id (default cli-<uuid>)")
    add("--first-frame", type=Path, metavar="IMAGE", help="a PNG, JPEG or WebP file the clip starts at (task fl2va)")
    add("--last-frame", type=Path, metavar="IMAGE", help="a PNG, JPEG or WebP file the clip ends at (task fl2va)")
    add(
        "--fit",
        choices=protocol.FITS,
        help=f"how a keyframe is fitted to the clip's size (server default {protocol.DEFAULT_FIT}): crop scales "
        "to cover and cuts the centre, pad scales to fit inside and fills the rest, stretch distorts",
    )
    add("--flow-shift", type=SHIFT, metavar="SHIFT", help="the video sigma schedule's shift (server default)")
    add("--audio-flow-shift", type=SHIFT, metavar="SHIFT", help="the audio sigma schedule's shift (server default)")
    add(
        "--lora",
        action="append",
        default=[],
        type=LORA,
        metavar="NAME[:SCALE]",
        help="apply the server's LoRA adapter NAME at SCALE (default 1.0, -4..4); repeat to compose, in order "
        "(docs/lora.md)",
    )
    add(
        "--cache-threshold",
        type=CACHE_THRESHOLD,
        metavar="T",
        help="step caching: skip the steps whose velocity barely changes, 0 (off) .. the server's "
        "max_cache_threshold (server default; docs/request_contract.md)",
    )
    add(
        "--reference-image",
        dest="reference_images",
        action="append",
        default=[],
        type=Path,
        metavar="IMAGE",
        help="a PNG, JPEG or WebP file of a character or an object the clip shows (task ref2va; repeatable)",
    )
    add(
        "--reference-video",
        dest="reference_videos",
        action="append",
        default=[],
        type=Path,
        metavar="VIDEO",
        help="an MP4 file (with its sound) the clip follows (task ref2va; repeatable)",
    )
    add(
        "--reference-audio",
        dest="reference_audio",
        action="append",
        default=[],
        type=Path,
        metavar="AUDIO",
        help="a WAV, FLAC or MP3 file of a voice or a sound the clip uses (task ref2va; repeatable)",
    )
    add(
        "--guide",
        dest="guides",
        action="append",
        default=[],
        type=GUIDE,
        metavar="IMAGE@FRAME",
        help="a PNG, JPEG or WebP file the clip shows at frame FRAME (0 .. frames - 1; task ref2va; repeatable)",
    )
    add(
        "--task",
        choices=protocol.TASKS,
        help="default: from the inputs (fl2va with a keyframe, ref2va with references or guides, else t2va)",
    )
    add(
        "--url",
        type=url_type,
        default=os.environ.get("H3_GRPC_URL", "127.0.0.1:8001"),
        help="host:port of Triton's gRPC endpoint, or several servers: dns:///host:port, ipv4:ADDR:PORT,...",
    )
    add(
        "--idle-timeout",
        type=SECONDS,
        default=600.0,
        metavar="SECONDS",
        help="the longest wait for a response, from sending and then from each response (default 600)",
    )
    add(
        "--total-timeout",
        type=SECONDS,
        metavar="SECONDS",
        help=f"the longest the whole request may take from sending (default none; with --deadline D: D + "
        f"{DEADLINE_MARGIN_S:g})",
    )
    args = parser.parse_args(argv)
    args.references = None
    if args.request is not None:
        read_request_file(parser, args)
    elif args.prompt is None:
        parser.error("give --prompt or --request")
    if args.preview_every is not None and args.preview_dir is None:
        parser.error("--preview-every needs --preview-dir")
    try:
        protocol.lora_list(args.lora)  # a name given twice
    except ValueError as error:
        parser.error(f"--lora: {error}")
    try:
        for flag, path in (("--out", args.out), ("--wav", args.wav)):
            for numbered_path in numbered(path, args.num_outputs) if path is not None else ():
                check_writable(flag, numbered_path)
        if args.preview_dir is not None:
            check_writable("--preview-dir", args.preview_dir, folder=True)
        for flag, key in (("--first-frame", "first_frame"), ("--last-frame", "last_frame")):
            if getattr(args, key) is not None:
                setattr(args, key, media_bytes(flag, getattr(args, key), "image"))
        for flag, key, media in (
            ("--reference-image", "reference_images", "image"),
            ("--reference-video", "reference_videos", "video"),
            ("--reference-audio", "reference_audio", "audio"),
        ):
            setattr(args, key, [media_bytes(flag, path, media) for path in getattr(args, key)])
        args.guides = [(media_bytes("--guide", path, "image"), frame) for path, frame in args.guides]
    except ValueError as error:
        parser.error(str(error))
    return args


REQUEST_FLAGS = {  # flags --request replaces: (flag, args key)
    "--prompt": "prompt",
    "--height": "height",
    "--width": "width",
    "--num-frames": "num_frames",
    "--steps": "steps",
    "--seed": "seed",
    "--task": "task",
    "--flow-shift": "flow_shift",
    "--audio-flow-shift": "audio_flow_shift",
    "--first-frame": "first_frame",
    "--last-frame": "last_frame",
    "--reference-image": "reference_images",
    "--reference-video": "reference_videos",
    "--reference-audio": "reference_audio",
    "--guide": "guides",
}


def read_request_file(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill args from --request's SGLang H3 JSON (request_model.read_sglang): the prompt, size,
    frames, forwards, seed, shifts, task, keyframes and references with their order. A flag it
    replaces, an unreadable file or a refusal ends with parser.error naming the field path."""
    given = [flag for flag, key in REQUEST_FLAGS.items() if getattr(args, key) not in (None, [])]
    if given:
        parser.error(f"--request replaces {given[0]}: give the request's fields in the file")
    try:
        body = json.loads(args.request.read_text(encoding="utf-8"))
        if not isinstance(body, dict):
            raise ValueError("must hold a JSON object")
        request = request_model.read_sglang(body)
    except (OSError, ValueError) as error:
        parser.error(f"--request {args.request}: {error}")
    args.prompt = request.prompt
    arguments = request.generate_arguments()  # H3Client.generate's, by the one request model
    arguments["steps"] = arguments.pop("num_inference_steps")
    arguments.pop("num_outputs")  # --num-outputs stays a flag (SGLang's H3 has no outputs field)
    arguments.pop("lora")  # --lora too (SGLang's H3 has no lora field)
    vars(args).update(arguments)


def stop_request(url: str, request_id: str, worker: threading.Thread, outcome: dict) -> str | None:
    """After Ctrl-C while `worker` runs the request: cancel it by id (through a client of its own
    whose idle timeout is CANCEL_WAIT_S seconds) and wait for the worker until STOP_WAIT_S seconds
    after the call. Returns the line to print, or None when the worker's results arrived (outcome["results"];
    outcome["error"] holds its H3Error)."""
    deadline = time.monotonic() + STOP_WAIT_S
    try:
        with H3Client(url, idle_timeout_s=CANCEL_WAIT_S) as canceller:
            answer, failure = canceller.cancel(request_id), None
    except H3Error as error:
        answer, failure = None, error
    if failure is None and answer != "unknown":
        worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        if failure is not None:
            return f"could not cancel request {request_id} on the server: {failure}"
        if answer == "unknown":  # queued before the DiT (e.g. behind a request-mode generation)
            return (
                f"cancelled before it started: request {request_id} had not reached the DiT; the server "
                f"remembers the id for {protocol.EARLY_CANCEL_SECONDS:g} s and ends it with CANCELLED when it does"
            )
        return (
            f"no final response for request {request_id} within {STOP_WAIT_S:g} s of Ctrl-C (the cancel "
            f"answered {answer!r}); it may still run on the server"
        )
    error = outcome.get("error")
    if error is None:
        return None
    if error.code == "CANCELLED":
        return f"cancelled on the server: {error.message}"
    return f"interrupted; request {request_id} ended with {error}"


def main(argv: list[str] | None = None, interrupted: threading.Event = INTERRUPTED) -> int:
    """Run the command line `argv` (sys.argv[1:] when None); returns the exit status. interrupted:
    Ctrl-C (on_sigint sets INTERRUPTED when run as a program); once it is set, main() stops as
    the module docstring says."""
    args = parse_args(argv)
    if interrupted.is_set():
        print("interrupted before the request was sent", file=sys.stderr)
        return 130
    request_id, outcome, bar, stopped = args.request_id or f"cli-{uuid.uuid4()}", {}, {}, None

    def on_progress(step: int, total: int, position: int) -> None:
        if "bar" not in bar:  # made at the first progress response: none when the connection fails
            bar["bar"] = tqdm(total=total, unit="step", desc="denoising")
        progress = bar["bar"]
        progress.set_postfix(queue=position) if position else progress.set_postfix()
        progress.update(step - progress.n)
        if step == total:
            progress.set_description("denoised, decoding")

    start = time.perf_counter()
    with H3Client(args.url, idle_timeout_s=args.idle_timeout, total_timeout_s=args.total_timeout) as client:

        def run() -> None:
            try:
                outcome["results"] = client.generate(
                    os.fsencode(args.prompt),  # the bytes as given; the server refuses bad UTF-8
                    height=args.height,
                    width=args.width,
                    num_frames=args.num_frames,
                    num_inference_steps=args.steps,
                    seed=args.seed,
                    num_outputs=args.num_outputs,
                    progress_every=1,
                    preview_every=args.preview_every or (1 if args.preview_dir is not None else 0),
                    deadline_s=args.deadline,
                    request_priority=args.priority,
                    request_id=request_id,
                    return_audio=args.wav is not None,
                    first_frame=args.first_frame,
                    last_frame=args.last_frame,
                    fit=args.fit,
                    flow_shift=args.flow_shift,
                    audio_flow_shift=args.audio_flow_shift,
                    cache_threshold=args.cache_threshold,
                    lora=args.lora,
                    task=args.task,
                    reference_images=args.reference_images,
                    reference_videos=args.reference_videos,
                    reference_audio=args.reference_audio,
                    guides=args.guides,
                    references=args.references,
                    on_progress=on_progress,
                )
            except H3Error as error:
                outcome["error"] = error
            except Exception as error:  # noqa: BLE001 - any failure ends the program with its one line
                outcome["error"] = H3Error("UNKNOWN", f"the client failed: {type(error).__name__}: {error}")

        worker = threading.Thread(target=run, daemon=True)  # the main thread stays free for Ctrl-C
        worker.start()
        while worker.is_alive() and not interrupted.is_set():
            worker.join(0.1)
        if worker.is_alive():
            stopped = stop_request(args.url, request_id, worker, outcome)
    if "bar" in bar:
        bar["bar"].close()
    if stopped is not None:
        print(stopped, file=sys.stderr)
        return 130
    if "error" in outcome:
        print(f"error: {outcome['error']}", file=sys.stderr)
        return 1
    results = outcome["results"]
    files = [(path, result.video_mp4) for result, path in zip(results, numbered(args.out, len(results)), strict=True)]
    if args.wav is not None:
        files += [
            (path, encode_wav(result.audio))
            for result, path in zip(results, numbered(args.wav, len(results)), strict=True)
        ]
    written = [str(path) for path, _ in files]
    try:
        for path, data in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if args.preview_dir is not None:
            args.preview_dir.mkdir(parents=True, exist_ok=True)
            for step, image in results[0].previews:
                np.save(args.preview_dir / f"step-{step:03d}.npy", image)
            written.append(f"{len(results[0].previews)} previews in {args.preview_dir}")
    except OSError as error:  # e.g. the disk is full: checked writable before, but not its space
        print(f"error: the clip was generated but could not be written: {error}", file=sys.stderr)
        return 1
    info = results[0].info
    seeds = ", ".join(str(result.info["seed"]) for result in results)
    print(
        f"{'the result arrived; ' if interrupted.is_set() else ''}"
        f"wrote {', '.join(written)} ({info['num_frames']} frames {info['width']}x{info['height']}, "
        f"{info['num_inference_steps']} steps) in {time.perf_counter() - start:.2f} s, "
        f"seed{'s' if len(results) > 1 else ''} {seeds}"
    )
    return 0


if __name__ == "__main__":
    status = main()  # bad flags end in SystemExit(2) before any gRPC client exists
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown (module docstring)
