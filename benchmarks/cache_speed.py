"""Step caching's speed (issue 34): the demo model's skip patterns replayed on a big DiT.

    PYTHONUNBUFFERED=1 python -m benchmarks.cache_speed --out DIR [--sections patterns replay concurrency]
        [--config tiny|bench|h3] [--quantization none|fp8] [--clips N] [--steps 30] [--picks min median max]

Random weights say nothing about hit rates, so the hit rates come from the demo model and the
speed from the big DiT replaying them:
  patterns:    the demo model (weights/demo, cache_quality.load; on CUDA on the GPU) runs the
               first --clips held-out clips of every task of cache_quality.TASKS at the recommended
               threshold (cache_demo_cpu.json's summary) at 8 and 30 steps, PACK requests per
               forward (training.evaluate.generate_states, the Engine path); each request's
               pattern is recorded at the product's decision point (StepCache.plan, called once per
               step by Engine.plan_step: `RecordingCache`): which steps computed, which took the
               cached velocity. Per step count: every request's pattern and skipped steps, the
               skipped fraction, and the picks: the requests with the fewest, the median and the
               most skipped steps.
  replay:      on the --config DiT (load_engine from random:0, as h3_dit builds it: compiled, CUDA
               graphs; --quantization as h3_dit's), --steps-step requests of the config's shape
               (SHAPES: 672x384, 209 frames = 16,384 rows for bench and h3) stepped alone
               (Engine.denoise_step + Engine.update, the device synchronised before and after):
               one without caching, then one per --picks replaying that pick's pattern at
               --steps. Per request: computed steps (steps - StepCache.skipped), seconds,
               speedup = uncached seconds / its seconds.
  concurrency: 4 requests of the shape and --steps at once through h3_dit's own step loop
               in-process (h3_core.serving.dit.step_loop.StepLoop: admission, step-cache planning,
               the srpt scheduler, packed forward, settling, results; no Triton, no encoder, no
               VAE), its settings those of the served 4-request pack (max_num_seqs 4,
               max_batch_rows = row_budget = 4 x rows): all uncached, then half of them (the
               first two) replaying the median pattern. Per run: total seconds, each request's
               latency (from the start to its Result) and INFO skipped_steps, throughput
               (requests / minute) against the all-uncached run, row-steps computed (the sum of
               h3_pack_rows, the rows of every forward), h3_cached_steps_total and graph_captures:
               the CUDA graphs captured during the run (GraphedForward.captures: a new pack
               structure, as skipped steps make, costs a capture; GRAPHS_KEPT are kept; 0 on
               the CPU, which has none).

Replaying (bench-local, nothing in h3_core): `OverrideEngine` is the Engine whose prepare()
swaps each new state's StepCache for `ReplayedCache`, a StepCache whose plan() runs the
product's plan (the change metric and its host read, which a cached request pays every step)
and then takes the step's decision from the pattern; Engine.plan_step, denoise_step, update, the
scheduler and the step loop then act on it as on any cached request. The replayed requests send
the recommended threshold (a threshold above 0 turns the planning on).

Each call adds its sections to DIR/cache_speed_h200.json (DIR/cache_speed_cpu.json without
CUDA), saved after every finished section with date, hardware, torch and command; replay and
concurrency are filed under their setting (config, _fp8 when quantised) and read the patterns
from that file, so `--sections patterns` and later calls may be split (the recorded run: patterns
on the CPU, that cache_speed_cpu.json copied as DIR/cache_speed_h200.json before the GPU calls;
every entry keeps its own hardware, torch and command). Prints a short table
last. Warm-up (untimed): Engine.warm_up, then the shape's first step (replay: a 3-step request
replaying computed / skipped / computed; concurrency: the 4-request run at 3 steps, half of them
replaying it), so compilation of the new pack sizes is not timed.

CPU smoke (tests/test_cache_speed.py): --config tiny (64x32, 5 frames: 64 rows) with patterns
of --steps steps already in the file. All three sections on the 2-core CPU (the demo's
build/captions/caption_states.safetensors present, cache_quality.CAPTIONS):
OMP_NUM_THREADS=1 python -m benchmarks.cache_speed --out DIR --clips 1 (about 15 s).
"""

import argparse
import datetime
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks import cache_quality
from benchmarks.step_timing import sync
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.diffusion.step_cache import StepCache
from h3_core.factory import load_engine
from h3_core.model.fp8 import QUANTIZATIONS
from h3_core.serving.dit.events import Arrival, Ended, Refused, Result
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import EXECUTE_BUDGET_S, DitSettings
from server.sizing import GPU_EXECUTE_BUDGET_S
from training import data
from training.evaluate import generate_states

SECTIONS = ("patterns", "replay", "concurrency")
PICKS = ("min", "median", "max")
PATTERN_STEPS = (8, 30)
SHAPES = {"tiny": (32, 64, 5), "bench": (384, 672, 209), "h3": (384, 672, 209)}  # height, width, num_frames
WEIGHTS = "random:0"  # h3_core.weights.checkpoint: seeded random weights drawn at load
TEXT_LEN = 9  # text tokens of the replayed requests (engine_bench's): 16,384 rows at 672x384, 209 frames
CONCURRENCY = 4
WARM_UP_PATTERN = (True, False, True)
DEMO_RESULTS = Path("benchmarks/results/cache_demo_cpu.json")


@dataclass(eq=False)  # compared by identity, as StepCache
class RecordingCache(StepCache):
    """A StepCache that records its decisions: computed[k] is True when step k computed (False:
    it took the cached velocity). plan() is called once per step (Engine.plan_step)."""

    computed: list[bool] = field(default_factory=list)

    def plan(self, step, total_steps, modulated, previous, polynomial) -> bool:
        skip = super().plan(step, total_steps, modulated, previous, polynomial)
        self.computed.append(not skip)
        return skip


@dataclass(eq=False)  # compared by identity, as StepCache
class ReplayedCache(StepCache):
    """A StepCache whose decisions are `pattern`'s (pattern[k]: step k computes): plan() runs
    StepCache.plan (the change metric, read on the host, as every cached request's step pays it)
    and then overrides its decision. Raises ValueError for a pattern whose first or last step
    does not compute (the product always computes them) or whose length is not total_steps."""

    pattern: tuple[bool, ...] = ()

    def plan(self, step, total_steps, modulated, previous, polynomial) -> bool:
        if len(self.pattern) != total_steps or not (self.pattern[0] and self.pattern[-1]):
            raise ValueError(
                f"pattern {self.pattern} does not fit a {total_steps}-step request: it needs {total_steps} "
                "entries, the first and the last True"
            )
        super().plan(step, total_steps, modulated, previous, polynomial)
        self.skip = not self.pattern[step]
        if not self.skip:
            self.accumulated = 0.0
        return self.skip


class OverrideEngine(Engine):
    """`engine` (its models, limits, preview, cache polynomial) whose prepare() replaces each
    new state's StepCache by make_cache(state) (a state's own cache: nothing replaced)."""

    def __init__(self, engine: Engine, make_cache):
        super().__init__(
            engine.dit,
            engine.video_vae,
            engine.audio_vae,
            engine.encoder,
            engine.limits,
            engine.preview,
            engine.cache_polynomial,
        )
        self.make_cache = make_cache

    def prepare(self, *args, **kwargs):
        states = super().prepare(*args, **kwargs)
        for state in states:
            state.cache = self.make_cache(state)
        return states


def replaying(engine: Engine, patterns: dict[str, tuple[bool, ...]]) -> OverrideEngine:
    """`engine` replaying patterns[request_id] for those requests (they must send a
    cache_threshold above 0); other requests run as they ask."""

    def make_cache(state):
        pattern = patterns.get(state.request_id)
        if pattern is None:
            return state.cache
        if state.cache.threshold <= 0:
            raise ValueError(f"request {state.request_id!r} replays a pattern: its cache_threshold must be > 0")
        return ReplayedCache(state.cache.threshold, pattern=tuple(pattern))

    return OverrideEngine(engine, make_cache)


def recommended_threshold() -> float:
    """The recommended cache_threshold of the demo model's quality run (docs/operations.md §"Step caching")."""
    return json.loads(DEMO_RESULTS.read_text())["summary"]["recommended_threshold"]


# ---- patterns ----------------------------------------------------------------------------------


def picks(skipped: list[int]) -> dict[str, int]:
    """Indices of the requests with the fewest, the median (the lower middle one of the sorted
    list) and the most skipped steps; the first such request on ties."""
    order = sorted(range(len(skipped)), key=lambda i: (skipped[i], i))
    return {"min": order[0], "median": order[(len(order) - 1) // 2], "max": order[-1]}


def record_patterns(clips: int, device: str) -> dict:
    """The patterns section (module docstring) for the first `clips` held-out clips."""
    threshold = recommended_threshold()
    engine, states = cache_quality.load(threshold, device)
    recorder = OverrideEngine(engine, lambda state: RecordingCache(state.cache.threshold))
    held_out = data.held_out_clips()[:clips]
    result = {
        "weights": str(cache_quality.WEIGHTS),
        "device": device,
        "threshold": threshold,
        "polynomial": list(engine.cache_polynomial),
        "clips_per_task": len(held_out),
        "tasks": list(cache_quality.TASKS),
        "pack": cache_quality.PACK,
        "steps": {},
    }
    for steps in PATTERN_STEPS:
        requests = []
        for task in cache_quality.TASKS:
            outputs = generate_states(recorder, held_out, steps, 0, cache_quality.PACK, states, task, threshold)
            for clip, (state, _, _) in enumerate(outputs):
                computed = state.cache.computed
                if len(computed) != steps or computed.count(False) != state.cache.skipped:
                    raise RuntimeError(f"{task} clip {clip}: recorded {computed}, skipped {state.cache.skipped}")
                requests.append({"task": task, "clip": clip, "computed": computed, "skipped": state.cache.skipped})
        skipped = [request["skipped"] for request in requests]
        result["steps"][str(steps)] = {
            "requests": requests,
            "skipped_fraction": round(sum(skipped) / (steps * len(requests)), 4),
            "picks": picks(skipped),
        }
    return result


def picked(patterns: dict, steps: int, names: list[str]) -> dict[str, dict]:
    """The picked requests' records of the patterns at `steps`. Raises ValueError when the
    patterns hold no such step count."""
    at = patterns["steps"].get(str(steps))
    if at is None:
        raise ValueError(f"--steps {steps}: the patterns hold {sorted(patterns['steps'], key=int)} steps only")
    return {name: at["requests"][at["picks"][name]] for name in names}


# ---- replay and concurrency --------------------------------------------------------------------


def big_engine(config: str, quantization: str, device: str, steps: int) -> tuple[Engine, float, float]:
    """(engine, load seconds, Engine.warm_up seconds): load_engine of `config` from WEIGHTS as
    h3_dit builds it (--quantization applied), request limits admitting the config's shape and
    `steps` steps."""
    height, width, frames = SHAPES[config]
    limits = RequestLimits(
        max_height=height,
        max_width=width,
        max_num_frames=frames,
        max_steps=max(steps, len(WARM_UP_PATTERN)),
        max_rows=2**20,
        max_request_mb=2**20,
    )
    start = time.perf_counter()
    engine = load_engine(
        config, WEIGHTS, device, with_encoder=False, with_vaes=False, limits=limits, quantization=quantization
    )
    loaded = time.perf_counter() - start
    return engine, loaded, engine.warm_up()


def bench_text(engine: Engine) -> torch.Tensor:
    """TEXT_LEN seeded random text states float32 [TEXT_LEN, text_dim] on the CPU."""
    return torch.randn(TEXT_LEN, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))


def timed_request(engine: Engine, request: GenerationRequest, text: torch.Tensor) -> tuple[float, object]:
    """(seconds, finished state) of `request` stepped alone to completion
    (Engine.run_to_completion), the device synchronised before and after."""
    states = engine.prepare(request, text)
    sync(engine.device)
    start = time.perf_counter()
    (state,) = engine.run_to_completion(states)
    sync(engine.device)
    return time.perf_counter() - start, state


def replay(engine: Engine, config: str, steps: int, choices: dict[str, dict], threshold: float) -> dict:
    """The replay section (module docstring): the uncached request, then one per pick."""
    height, width, frames = SHAPES[config]
    text = bench_text(engine)
    patterns = {"warm-up": WARM_UP_PATTERN, **{f"replay_{name}": tuple(r["computed"]) for name, r in choices.items()}}
    engine = replaying(engine, patterns)
    warm_up = GenerationRequest(
        "warm-up", height, width, frames, len(WARM_UP_PATTERN), seed=0, request_id="warm-up", cache_threshold=threshold
    )
    warm_up_s, _ = timed_request(engine, warm_up, text)
    requests = {"uncached": (0.0, None), **{f"replay_{name}": (threshold, r) for name, r in choices.items()}}
    rows, runs = None, {}
    for request_id, (request_threshold, source) in requests.items():
        request = GenerationRequest(
            request_id, height, width, frames, steps, seed=0, request_id=request_id, cache_threshold=request_threshold
        )
        seconds, state = timed_request(engine, request, text)
        rows = state.rows
        computed = steps - state.cache.skipped
        runs[request_id] = {
            "computed_steps": computed,
            "skipped_steps": state.cache.skipped,
            "seconds": seconds,
            "seconds_per_step": seconds / steps,
            **({} if source is None else {"pattern": source}),
        }
        print(f"replay {request_id}: {computed} of {steps} steps computed, {seconds:.3f} s", flush=True)
    for run in runs.values():
        run["speedup"] = runs["uncached"]["seconds"] / run["seconds"]
        run["computed_step_ratio"] = steps / run["computed_steps"]
    return {"shape": list(SHAPES[config]), "rows": rows, "steps": steps, "warm_up_s": warm_up_s, "requests": runs}


def serve(engine: Engine, settings: DitSettings, config: str, steps: int, cached: dict, text: torch.Tensor) -> dict:
    """CONCURRENCY requests of the config's shape and `steps` steps arriving at once at a
    StepLoop over `engine` (a replaying one), stepped until all have their result; the ids in
    `cached` send cache_threshold cached[id]. Returns seconds (total), throughput_req_per_min,
    forwards (packed DiT forwards), row_steps_computed (sum of h3_pack_rows),
    cached_steps_total (h3_cached_steps_total), graph_captures (graph_captures(engine) during
    the run) and per request its latency_s and INFO's
    cache_threshold, skipped_steps and largest_pack. Raises RuntimeError when a request is refused or ends otherwise."""
    height, width, frames = SHAPES[config]
    fields = {"height": height, "width": width, "num_frames": frames, "num_inference_steps": steps}
    metrics, results = MetricsRecord(), {}
    with tempfile.TemporaryDirectory(prefix="h3_cache_speed.") as folder:
        loop = StepLoop(engine, settings, Registry(Path(folder), "i0"), metrics)
        live = {
            key: Arrival(
                handle=key,
                key=key,
                request_id=request_id,
                new=True,
                request_json=[json.dumps({**fields, "seed": key}).encode()],
                text_embeds=text[None].numpy(),
                parameters_json=json.dumps({"cache_threshold": cached.get(request_id, 0.0), "return_mp4": False}),
            )
            for key, request_id in enumerate(request_ids(), start=1)
        }
        sync(engine.device)
        captures_before = graph_captures(engine)
        start = time.perf_counter()

        def send(event) -> None:
            if isinstance(event, Refused):
                raise RuntimeError(f"request {event.handle} was refused: {event.code}: {event.message}")
            if isinstance(event, Ended):
                raise RuntimeError(f"request {event.request_id} did not finish: {event.message}")
            if isinstance(event, Result) and event.final:  # its latents are on the CPU: the step has ended
                results[event.request_id] = {"latency_s": time.perf_counter() - start, "info": event.info}

        while live:
            reschedule = loop.iterate(list(live.values()), send)
            for key in list(live):
                if key in reschedule:
                    live[key].new = False
                else:
                    del live[key]
        total = time.perf_counter() - start
    pack_rows = metrics.observed.get("h3_pack_rows", [])
    return {
        "seconds": total,
        "throughput_req_per_min": len(results) * 60 / total,
        "forwards": len(pack_rows),
        "row_steps_computed": int(sum(pack_rows)),
        "cached_steps_total": int(metrics.values.get("h3_cached_steps_total", 0)),
        "graph_captures": graph_captures(engine) - captures_before,
        "requests": {
            request_id: {
                "latency_s": result["latency_s"],
                "cache_threshold": result["info"]["cache_threshold"],
                "skipped_steps": result["info"]["skipped_steps"],
                "largest_pack": result["info"]["largest_pack"],
            }
            for request_id, result in sorted(results.items())
        },
    }


def graph_captures(engine: Engine) -> int:
    """CUDA graphs the engine's DiT has captured so far (H3DiT.graphs.captures; 0 without graphs:
    the CPU, a sequence-parallel DiT)."""
    graphs = getattr(engine.dit, "graphs", None)
    return 0 if graphs is None else graphs.captures


def request_ids() -> list[str]:
    """The concurrency section's request ids: the first half replay a pattern in the cached run."""
    return [f"request_{index}" for index in range(CONCURRENCY)]


def concurrency_settings(engine: Engine, config: str, steps: int, rows: int) -> DitSettings:
    """The step loop's settings of the concurrency section: the served 4-request pack of
    `rows`-row requests of `steps` steps (module docstring)."""
    height, width, frames = SHAPES[config]
    return DitSettings(
        config_name=config,
        device=str(engine.device),
        max_num_seqs=CONCURRENCY,
        max_batch_rows=CONCURRENCY * rows,
        row_budget=CONCURRENCY * rows,
        max_height=height,
        max_width=width,
        max_num_frames=frames,
        max_steps=max(steps, len(WARM_UP_PATTERN)),
        max_request_mb=2**20,
        execute_budget_s=GPU_EXECUTE_BUDGET_S if engine.device.type == "cuda" else EXECUTE_BUDGET_S,
    )


def concurrency(engine: Engine, config: str, steps: int, median: dict, threshold: float) -> dict:
    """The concurrency section (module docstring)."""
    text = bench_text(engine)
    (rows,) = [state.rows for state in engine.prepare(GenerationRequest("-", *SHAPES[config], steps), text)]
    settings = concurrency_settings(engine, config, steps, rows)
    half = request_ids()[: CONCURRENCY // 2]
    warm_up = replaying(engine, dict.fromkeys(half, WARM_UP_PATTERN))
    warm_up_s = serve(warm_up, settings, config, len(WARM_UP_PATTERN), dict.fromkeys(half, threshold), text)["seconds"]
    uncached = serve(engine, settings, config, steps, {}, text)
    cached = serve(
        replaying(engine, dict.fromkeys(half, tuple(median["computed"]))),
        settings,
        config,
        steps,
        dict.fromkeys(half, threshold),
        text,
    )
    cached["throughput_over_uncached"] = cached["throughput_req_per_min"] / uncached["throughput_req_per_min"]
    cached["row_step_reduction"] = uncached["row_steps_computed"] / cached["row_steps_computed"]
    return {
        "shape": list(SHAPES[config]),
        "rows": rows,
        "steps": steps,
        "settings": {
            key: getattr(settings, key)
            for key in ("scheduling_policy", "max_num_seqs", "max_batch_rows", "row_budget", "execute_budget_s")
        },
        "pattern": median,
        "warm_up_s": warm_up_s,
        "uncached": uncached,
        "half_cached": cached,
    }


# ---- the call ----------------------------------------------------------------------------------


def setting_name(config: str, quantization: str) -> str:
    """The key replay and concurrency results are filed under: the config, `_fp8` when quantised."""
    return config if quantization == "none" else f"{config}_{quantization}"


def print_table(results: dict) -> None:
    """The short table of everything in `results`."""
    patterns = results.get("patterns")
    if patterns:
        for steps, at in patterns["steps"].items():
            skipped = [r["skipped"] for r in at["requests"]]
            print(
                f"patterns {steps} steps (demo, threshold {patterns['threshold']}, {len(skipped)} requests): skipped "
                f"{at['skipped_fraction']:.1%}; per request min {min(skipped)} / median "
                f"{sorted(skipped)[(len(skipped) - 1) // 2]} / max {max(skipped)}"
            )
    for name, run in results.get("replay", {}).items():
        print(f"replay {name}, {run['rows']} rows, {run['steps']} steps")
        print(f"  {'request':<16}{'computed':>9}{'seconds':>10}{'speedup':>9}{'steps/computed':>16}")
        for request_id, r in run["requests"].items():
            print(
                f"  {request_id:<16}{r['computed_steps']:>9}{r['seconds']:>10.3f}{r['speedup']:>9.2f}"
                f"{r['computed_step_ratio']:>16.2f}"
            )
    for name, run in results.get("concurrency", {}).items():
        print(f"concurrency {name}, {CONCURRENCY} x {run['rows']} rows, {run['steps']} steps")
        print(f"  {'run':<12}{'seconds':>9}{'req/min':>9}{'latencies s':>28}{'row-steps':>12}{'cached':>8}")
        for key in ("uncached", "half_cached"):
            r = run[key]
            latencies = " ".join(f"{v['latency_s']:.2f}" for v in r["requests"].values())
            print(
                f"  {key:<12}{r['seconds']:>9.2f}{r['throughput_req_per_min']:>9.2f}{latencies:>28}"
                f"{r['row_steps_computed']:>12}{r['cached_steps_total']:>8}"
            )
        half = run["half_cached"]
        print(
            f"  graphs captured: uncached {run['uncached'].get('graph_captures', 'not recorded')}, half cached "
            f"{half.get('graph_captures', 'not recorded')}; "
            f"throughput half cached / uncached {half['throughput_over_uncached']:.2f} x; "
            f"row-steps {half['row_step_reduction']:.2f} x fewer"
        )


def main(argv: list[str] | None = None) -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of cache_speed_h200.json (cpu without CUDA)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="run in this order")
    parser.add_argument("--config", choices=sorted(SHAPES), default="bench" if cuda else "tiny")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="none", help="h3_dit's (default none)")
    parser.add_argument(
        "--clips", type=int, default=len(data.held_out_clips()), help="held-out clips per task (patterns)"
    )
    parser.add_argument("--steps", type=int, choices=PATTERN_STEPS, default=30, help="steps of replayed requests")
    parser.add_argument("--picks", nargs="+", choices=PICKS, default=list(PICKS), help="patterns replayed")
    args = parser.parse_args(argv)
    device = "cuda" if cuda else "cpu"
    path = args.out / f"cache_speed_{'h200' if cuda else 'cpu'}.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    sections = [section for section in SECTIONS if section in args.sections]
    run = {
        "date": datetime.date.today().isoformat(),
        "hardware": torch.cuda.get_device_name() if cuda else "CPU",
        "torch": torch.__version__,
        "command": "PYTHONUNBUFFERED=1 python -m benchmarks.cache_speed "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    results.update(run)
    name = setting_name(args.config, args.quantization)

    def save(section: str, value: dict, seconds: float) -> None:
        entry = {**run, "seconds": seconds, **value}
        if section == "patterns":
            results[section] = entry
        else:
            results.setdefault(section, {})[name] = entry
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")

    if "patterns" in sections:
        start = time.perf_counter()
        save("patterns", record_patterns(args.clips, device), time.perf_counter() - start)
    if "patterns" not in results and sections != ["patterns"]:
        parser.error(f"{path} holds no patterns: run --sections patterns first")
    threshold = results.get("patterns", {}).get("threshold")
    engine = None
    for section in [s for s in sections if s != "patterns"]:
        start = time.perf_counter()
        if engine is None:
            engine, load_s, warm_up_s = big_engine(args.config, args.quantization, device, args.steps)
            results.setdefault("engines", {})[name] = {"load_s": load_s, "warm_up_s": warm_up_s}
            start = time.perf_counter()
        if section == "replay":
            value = replay(
                engine, args.config, args.steps, picked(results["patterns"], args.steps, args.picks), threshold
            )
        else:
            (median,) = picked(results["patterns"], args.steps, ["median"]).values()
            value = concurrency(engine, args.config, args.steps, median, threshold)
        save(section, {"quantization": args.quantization, **value}, time.perf_counter() - start)
    print()
    print_table(results)


if __name__ == "__main__":
    main()
