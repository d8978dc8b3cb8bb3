"""Bounded soak of the served pipeline: random shapes, cancels and deadlines at a fixed concurrency.

    .venv/bin/python scripts/soak.py --requests 500 --concurrency 8 --json out/soak.json

Starts tritonserver on model_repository/ (tiny config, CPU) on free ports and stops it at the
end; once it is ready, progress bars on stderr count the requests. Request i uses one of
--specs request specs (prompt, height, width, num_frames, steps, num_outputs, seed: drawn once
from --seed) and asks for FRAMES and AUDIO; a random --cancel-fraction of the requests is
cancelled by id after 0..--max-cancel-delay s, another --deadline-fraction gets deadline_s
drawn from 0.05..0.5 s; progress_every is 0, 1 or 3. Every spec first runs alone (its
reference, which also warms the server up), then --warmup requests run at full concurrency
before the DiT's resident memory is taken as the baseline.

Checks (exit status 1 when one fails; all are printed and, with --json, saved):
  * every request ends with exactly one final response: its results, or one error;
  * every completed output's FRAMES and AUDIO are byte-identical to its spec's reference;
  * a cancelled or expired request (CANCELLED:) delivered no result; no other error occurs;
  * the DiT process's RSS at the end is less than 5 % above the baseline (sampled every 50);
  * at the end no request is active or waiting in h3_dit and Triton has none pending;
  * when the server stops, tritonserver counts no request in flight (Triton 2.51 keeps counting
    an ensemble request that ended with an error response while h3_vae still held one of its
    progress responses: h3_dit's `ending` avoids that).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import queue
import random
import re
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import tritonclient.grpc as grpcclient
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.api import H3Client, H3Error  # noqa: E402 - after the sys.path set-up above
from client.inputs import scalar_input  # noqa: E402 - after the sys.path set-up above
from server.process import TritonServer, dit_stubs, stub_pids  # noqa: E402 - after the sys.path set-up above

RSS_GROWTH_LIMIT = 0.05
RSS_EVERY = 50  # requests between RSS samples
STREAM_TIMEOUT_S = 120.0
SHAPES = [(32, 32, 1), (32, 64, 5), (64, 64, 9), (64, 96, 22), (96, 64, 9), (64, 32, 13)]


@dataclass
class Outcome:
    """How one request ended: finals counts final responses plus errors (must be 1)."""

    request_id: str
    spec: int
    action: str  # plain, cancel or deadline
    finals: int = 0
    error: str = ""  # code word of the error, "" if none
    results: dict = field(default_factory=dict)  # output index -> (frames sha256, audio sha256)


def make_specs(rng: random.Random, count: int) -> list[dict]:
    specs = []
    for k in range(count):
        height, width, frames = rng.choice(SHAPES)
        specs.append(
            dict(
                prompt=f"soak clip {k}: a shape moves while a tone plays",
                height=height,
                width=width,
                num_frames=frames,
                num_inference_steps=rng.randint(2, 40),
                num_outputs=2 if rng.random() < 0.2 else 1,
                seed=rng.randrange(2**31),
            )
        )
    return specs


def digest(result) -> tuple[str, str]:
    return (
        hashlib.sha256(result.as_numpy("FRAMES").tobytes()).hexdigest(),
        hashlib.sha256(result.as_numpy("AUDIO").tobytes()).hexdigest(),
    )


def run_request(url: str, spec: dict, outcome: Outcome, parameters: dict) -> Outcome:
    """Stream one h3_pipeline request; after its final response the stream is closed without
    cancelling, which waits for anything the server still sends (so a second final would be
    counted)."""
    names = {
        "height": "HEIGHT",
        "width": "WIDTH",
        "num_frames": "NUM_FRAMES",
        "num_inference_steps": "NUM_INFERENCE_STEPS",
        "num_outputs": "NUM_OUTPUTS",
        "seed": "SEED",
    }
    inputs = [scalar_input("PROMPT", spec["prompt"].encode(), "BYTES")] + [
        scalar_input(n, spec[k], "INT64") for k, n in names.items()
    ]
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("FRAMES", "AUDIO", "PROGRESS", "INFO")]
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    ended = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            "h3_pipeline",
            inputs,
            outputs=outputs,
            request_id=outcome.request_id,
            parameters={**parameters, "return_frames": True, "return_audio": True},
            enable_empty_final_response=True,
        )
        while not ended:
            result, error = responses.get(timeout=STREAM_TIMEOUT_S)
            ended = record(outcome, result, error)
    except queue.Empty:
        outcome.error = "TIMEOUT"
    finally:
        client.stop_stream(cancel_requests=not ended)
        client.close()
    while not responses.empty():  # anything after the final response
        record(outcome, *responses.get())
    return outcome


def record(outcome: Outcome, result, error) -> bool:
    """Count one response (final ones in outcome.finals, an error response counts as final);
    True if it ended the request."""
    if error is not None:
        outcome.finals += 1
        outcome.error = H3Error.from_server(error).code
        return True
    info_tensor = result.as_numpy("INFO")  # None on the empty final response that ends a stream
    info = json.loads(info_tensor.reshape(-1)[0]) if info_tensor is not None and info_tensor.size else {}
    if info.get("kind") == "result":
        outcome.results[info["output_index"]] = digest(result)
    if info.get("kind") == "error":  # a started request that ended early (h3_dit's `ending`)
        outcome.error = info["code"]
    final = result.get_response().parameters["triton_final_response"].bool_param
    outcome.finals += final
    return final


def in_flight_at_stop(log: str) -> int:
    """Requests tritonserver still counted in flight when it was told to stop (its first
    "Found N model versions that have in-flight inferences" report and the lines after it)."""
    models = int(re.search(r"Found (\d+) model versions that have in-flight inferences", log).group(1))
    return sum(int(n) for n in re.findall(r"\) has (\d+) in-flight inferences", log)[:models])


def dit_rss_kb(server: TritonServer) -> int:
    status = Path(f"/proc/{dit_stubs(stub_pids(server.pid))[0]}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def run(args: argparse.Namespace) -> dict:
    """Start a server, run the soak, stop the server; returns the summary (see the checks)."""
    rng = random.Random(args.seed)
    specs = make_specs(rng, args.specs)
    plan = []
    for i in range(args.warmup + args.requests):
        draw = rng.random()
        action = (
            "cancel"
            if draw < args.cancel_fraction
            else ("deadline" if draw < args.cancel_fraction + args.deadline_fraction else "plain")
        )
        parameters = {"progress_every": rng.choice([0, 1, 3])}
        if action == "deadline":
            parameters["deadline_s"] = round(rng.uniform(0.05, 0.5), 3)
        plan.append(
            (
                Outcome(f"soak-{args.seed}-{i}", rng.randrange(len(specs)), action),
                parameters,
                rng.uniform(0, args.max_cancel_delay),
            )
        )
    started = time.monotonic()
    print(f"starting tritonserver on {ROOT / 'model_repository'}", file=sys.stderr, flush=True)
    with TritonServer(ROOT / "model_repository", free_ports=True) as server:
        references = []
        for k, spec in enumerate(tqdm(specs, desc="references", unit="req", file=sys.stderr)):
            reference = run_request(server.grpc_url, spec, Outcome(f"soak-{args.seed}-reference-{k}", k, "plain"), {})
            assert reference.finals == 1 and not reference.error and len(reference.results) == spec["num_outputs"], (
                reference
            )
            references.append(reference.results)
        canceller = H3Client(server.grpc_url, idle_timeout_s=STREAM_TIMEOUT_S)
        rss, done, lock = [], [0], threading.Lock()
        progress = tqdm(total=len(plan), desc=f"soak ({args.warmup} warm-up first)", unit="req", file=sys.stderr)

        def cancel(request_id: str) -> None:
            try:
                canceller.cancel(request_id)
            except H3Error as error:
                print(f"cancel {request_id}: {error}", file=sys.stderr)

        def one(entry) -> Outcome:
            outcome, parameters, delay = entry
            timer = threading.Timer(delay, cancel, args=(outcome.request_id,))
            if outcome.action == "cancel":
                timer.start()
            run_request(server.grpc_url, specs[outcome.spec], outcome, parameters)
            if outcome.action == "cancel":
                timer.join()
            with lock:
                progress.update(1)
                done[0] += 1
                if done[0] > args.warmup and (done[0] - args.warmup) % RSS_EVERY == 0:
                    rss.append(dit_rss_kb(server))
            return outcome

        with progress, ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, plan[: args.warmup]))
            baseline = dit_rss_kb(server)
            outcomes = list(pool.map(one, plan[args.warmup :]))
        deadline = time.monotonic() + 10
        while True:  # the last cancelled requests leave at their next step boundary
            metrics = server.h3_metrics()
            left = {k: metrics.get(k, 0) for k in ("h3_active_requests", "h3_waiting_requests", "pending")}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        final_rss = dit_rss_kb(server)
        server.stop()
        leaked = in_flight_at_stop(server.log_text())
    wrong = [o.request_id for o in outcomes if o.results and o.results != {k: references[o.spec][k] for k in o.results}]
    incomplete = [o.request_id for o in outcomes if not o.error and len(o.results) != specs[o.spec]["num_outputs"]]
    mixed = [o.request_id for o in outcomes if o.error == "CANCELLED" and o.results]
    summary = {
        "requests": len(outcomes),
        "concurrency": args.concurrency,
        "warmup": args.warmup,
        "seconds": round(time.monotonic() - started, 1),
        "actions": {a: sum(o.action == a for o in outcomes) for a in ("plain", "cancel", "deadline")},
        "completed": sum(not o.error for o in outcomes),
        "errors": {
            code: sum(o.error == code for o in outcomes) for code in sorted({o.error for o in outcomes if o.error})
        },
        "final_responses_per_request": {
            n: sum(o.finals == n for o in outcomes) for n in sorted({o.finals for o in outcomes})
        },
        "outputs_compared": sum(len(o.results) for o in outcomes),
        "outputs_not_identical": wrong,
        "completed_without_all_outputs": incomplete,
        "cancelled_with_results": mixed,
        "dit_rss_kb": {
            "baseline": baseline,
            "samples": rss,
            "final": final_rss,
            "growth": round(final_rss / baseline - 1, 4),
        },
        "left_at_end": left,
        "in_flight_at_stop": leaked,
    }
    summary["passed"] = (
        summary["final_responses_per_request"] == {1: len(outcomes)}
        and not wrong
        and not incomplete
        and not mixed
        and set(summary["errors"]) <= {"CANCELLED"}
        and summary["dit_rss_kb"]["growth"] < RSS_GROWTH_LIMIT
        and not any(left.values())
        and leaked == 0
    )
    return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=500, help="measured requests (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=50, help="requests before the RSS baseline (default: %(default)s)")
    p.add_argument("--specs", type=int, default=24, help="distinct request specs (default: %(default)s)")
    p.add_argument("--cancel-fraction", type=float, default=0.3, help="default: %(default)s")
    p.add_argument("--deadline-fraction", type=float, default=0.1, help="default: %(default)s")
    p.add_argument("--max-cancel-delay", type=float, default=0.5, help="seconds (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the plan (default: %(default)s)")
    p.add_argument("--json", type=Path, help="also write the summary, the command and the date here")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    summary = run(args)
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        command = shlex.join([".venv/bin/python", "scripts/soak.py", *(sys.argv[1:] if argv is None else argv)])
        args.json.write_text(
            json.dumps({"command": command, "date": datetime.date.today().isoformat(), "summary": summary}, indent=1)
        )
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
