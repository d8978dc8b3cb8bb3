"""Generate a clip with sound from a prompt through a running tritonserver.

    python -m client.generate --prompt "a red ball rolls to the left" --out out/clip.mp4

The server's gRPC endpoint comes from --url, else $H3_GRPC_URL, else 127.0.0.1:8001.
Ctrl-C cancels the request on the server (by its id) and waits briefly for the cancelled
final response before closing the stream.
"""
import argparse
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

from tqdm import tqdm

from h3_core.media import write_wav

from .api import H3Client, H3Error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--out", type=Path, required=True, help="output .mp4 path")
    parser.add_argument("--wav", type=Path, help="also write the audio as a .wav file")
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--num-frames", type=int)
    parser.add_argument("--steps", type=int, help="number of denoise steps (DiT forwards)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--url", default=os.environ.get("H3_GRPC_URL", "127.0.0.1:8001"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each response")
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    for flag, path in (("--out", args.out), ("--wav", args.wav)):
        if path is not None and path.is_dir():
            parser.error(f"{flag} {path} is a folder; give a file path")

    bar = tqdm(unit="step", desc="denoising")

    def on_progress(step: int, total: int, position: int) -> None:
        bar.total = total
        bar.set_postfix(queue=position) if position else bar.set_postfix()
        bar.update(step - bar.n)

    start = time.perf_counter()
    client, request_id, outcome = H3Client(args.url, args.timeout), f"cli-{uuid.uuid4()}", {}

    def run() -> None:
        try:
            outcome["result"] = client.generate(
                os.fsencode(args.prompt),  # the bytes as given; the server refuses bad UTF-8
                height=args.height, width=args.width, num_frames=args.num_frames,
                num_inference_steps=args.steps, seed=args.seed, progress_every=1, request_id=request_id,
                return_audio=args.wav is not None, on_progress=on_progress)[0]
        except H3Error as error:
            outcome["error"] = error

    interrupted = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: interrupted.set())  # no KeyboardInterrupt inside gRPC
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive() and not interrupted.is_set():
        worker.join(0.1)
    if interrupted.is_set():
        bar.close()
        print(f"cancelling {request_id} ...", file=sys.stderr)
        client.cancel(request_id)
        worker.join(10.0)
        print(f"cancelled: {outcome.get('error', 'no final response within 10 s')}", file=sys.stderr)
        return 130
    bar.close()
    if "error" in outcome:
        print(f"error: {outcome['error']}", file=sys.stderr)
        return 1
    result = outcome["result"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(result.video_mp4)
    if args.wav is not None:
        write_wav(args.wav, result.audio)
    info = result.info
    print(f"wrote {args.out}{f' and {args.wav}' if args.wav is not None else ''} ({info['num_frames']} frames "
          f"{info['width']}x{info['height']}, {info['num_inference_steps']} steps) in "
          f"{time.perf_counter() - start:.2f} s, seed {info['seed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
