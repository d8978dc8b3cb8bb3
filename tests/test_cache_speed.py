"""benchmarks/cache_speed.py: the recorded and the replayed step patterns act at the product's
decision point (StepCache.plan through Engine.plan_step), and the CPU smoke's replay and
concurrency sections report the pattern's computed steps, skipped steps and rows."""

import json

import pytest
import torch

from benchmarks import cache_speed
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine

STEPS = 8
# hand-made 8-step patterns (True: the step computes): skipped 4, 6 and 0 steps
PATTERNS = {
    "threshold": 0.1,
    "steps": {
        "8": {
            "requests": [
                {
                    "task": "t2va",
                    "clip": 0,
                    "computed": [True, False, True, False, True, False, False, True],
                    "skipped": 4,
                },
                {"task": "first", "clip": 0, "computed": [True] + [False] * 6 + [True], "skipped": 6},
                {"task": "image", "clip": 0, "computed": [True] * STEPS, "skipped": 0},
            ],
            "skipped_fraction": 10 / 24,
            "picks": cache_speed.picks([4, 6, 0]),
        }
    },
}


@pytest.fixture(scope="module")
def engine():
    return load_engine("tiny", cache_speed.WEIGHTS, "cpu", with_encoder=False, with_vaes=False)


def run(engine, threshold: float, request_id: str = "r"):
    request = GenerationRequest(
        "-", *cache_speed.SHAPES["tiny"], STEPS, seed=0, request_id=request_id, cache_threshold=threshold
    )
    return engine.run_to_completion(engine.prepare(request, cache_speed.bench_text(engine)))[0]


def test_picks():
    assert cache_speed.picks([4, 6, 0]) == {"min": 2, "median": 0, "max": 1}
    assert cache_speed.picks([3, 3, 1, 5]) == {"min": 2, "median": 0, "max": 3}  # the first on ties


def test_recorded_pattern_replays_bit_for_bit(engine):
    """The product's decisions (threshold 0.1 on the tiny random DiT) recorded, then replayed:
    the same steps skipped and the same latents, torch.equal."""
    plain = run(engine, 0.1)
    recorded = run(cache_speed.OverrideEngine(engine, lambda s: cache_speed.RecordingCache(s.cache.threshold)), 0.1)
    assert recorded.cache.computed == [True, False, False, True, False, True, True, True]
    assert recorded.cache.skipped == plain.cache.skipped == 3
    assert torch.equal(recorded.video_latents, plain.video_latents)
    replayed = run(cache_speed.replaying(engine, {"r": tuple(recorded.cache.computed)}), 0.1)
    assert isinstance(replayed.cache, cache_speed.ReplayedCache) and replayed.cache.skipped == 3
    assert torch.equal(replayed.video_latents, plain.video_latents)
    assert torch.equal(replayed.audio_latents, plain.audio_latents)
    other = run(cache_speed.replaying(engine, {"r": (True,) + (False,) * 6 + (True,)}), 0.1)
    assert other.cache.skipped == 6 and not torch.equal(other.video_latents, plain.video_latents)


def test_bad_patterns(engine):
    with pytest.raises(ValueError, match=r"does not fit a 8-step request: it needs 8 entries, the first and the last"):
        run(cache_speed.replaying(engine, {"r": (False,) + (True,) * 7}), 0.1)
    with pytest.raises(ValueError, match="request 'r' replays a pattern: its cache_threshold must be > 0"):
        run(cache_speed.replaying(engine, {"r": (True,) * STEPS}), 0.0)


def test_cpu_smoke_replay_and_concurrency(tmp_path):
    (tmp_path / "cache_speed_cpu.json").write_text(json.dumps({"patterns": PATTERNS}))
    cache_speed.main(["--out", str(tmp_path), "--sections", "replay", "concurrency", "--steps", "8"])
    result = json.loads((tmp_path / "cache_speed_cpu.json").read_text())
    assert result["patterns"] == PATTERNS and result["hardware"] == "CPU"
    assert result["command"].endswith("--sections replay concurrency --steps 8")
    replay = result["replay"]["tiny"]
    assert (replay["rows"], replay["steps"], replay["shape"]) == (64, STEPS, [32, 64, 5])
    requests = replay["requests"]
    assert list(requests) == ["uncached", "replay_min", "replay_median", "replay_max"]
    assert (requests["uncached"]["computed_steps"], requests["uncached"]["skipped_steps"]) == (STEPS, 0)
    for name, index in PATTERNS["steps"]["8"]["picks"].items():
        pattern = PATTERNS["steps"]["8"]["requests"][index]
        request = requests[f"replay_{name}"]
        assert request["pattern"] == pattern
        assert request["computed_steps"] == pattern["computed"].count(True)
        assert request["skipped_steps"] == pattern["computed"].count(False)
        assert request["speedup"] == requests["uncached"]["seconds"] / request["seconds"]
    concurrency = result["concurrency"]["tiny"]
    assert concurrency["pattern"] == PATTERNS["steps"]["8"]["requests"][0]  # the median: 4 steps computed
    uncached, half = concurrency["uncached"], concurrency["half_cached"]
    assert (uncached["row_steps_computed"], uncached["cached_steps_total"], uncached["forwards"]) == (4 * 64 * 8, 0, 8)
    # two requests compute all 8 steps, two the pattern's 4; every step has a forward
    assert (half["row_steps_computed"], half["cached_steps_total"], half["forwards"]) == (2 * 64 * (8 + 4), 8, 8)
    assert half["row_step_reduction"] == 2048 / 1536
    info = {request_id: (r["cache_threshold"], r["skipped_steps"]) for request_id, r in half["requests"].items()}
    assert info == {"request_0": (0.1, 4), "request_1": (0.1, 4), "request_2": (0.0, 0), "request_3": (0.0, 0)}
    assert all(r["skipped_steps"] == 0 and r["largest_pack"] == 4 for r in uncached["requests"].values())
    assert (uncached["graph_captures"], half["graph_captures"]) == (0, 0)  # the CPU has no CUDA graphs


class CountingGraphs:
    """Stands for GraphedForward on the CPU: one capture per new pack structure (its key:
    the layouts and the count of distinct timesteps), the eager forward otherwise."""

    def __init__(self, dit):
        self.dit, self.max_rows, self.captures, self.keys = dit, 2**31, 0, set()

    def __call__(self, video, audio, text, batch):
        key = (tuple(batch.layouts), len(batch.unique_timesteps))
        if key not in self.keys:
            self.keys.add(key)
            self.captures += 1
        return self.dit.forward_rows(video, audio, text, *self.dit.device_batch(batch))


def test_the_concurrency_runs_report_the_graphs_they_capture(engine, monkeypatch):
    """Issue 43 item 4: each run reports graph_captures, the captures during it: the uncached
    run packs the 4 requests alike at every step, two structures (step 0: video and audio share
    timestep 0; later their shifted timesteps differ); with two requests skipping steps, the
    packs of the other two are a third."""
    monkeypatch.setattr(engine.dit, "graphs", CountingGraphs(engine.dit))
    text = cache_speed.bench_text(engine)
    rows = engine.prepare(GenerationRequest("-", *cache_speed.SHAPES["tiny"], STEPS), text)[0].rows
    settings = cache_speed.concurrency_settings(engine, "tiny", STEPS, rows)
    uncached = cache_speed.serve(engine, settings, "tiny", STEPS, {}, text)
    median = tuple(PATTERNS["steps"]["8"]["requests"][0]["computed"])
    half = cache_speed.request_ids()[:2]
    cached = cache_speed.serve(
        cache_speed.replaying(engine, dict.fromkeys(half, median)),
        settings,
        "tiny",
        STEPS,
        dict.fromkeys(half, 0.1),
        text,
    )
    assert (uncached["forwards"], uncached["graph_captures"]) == (STEPS, 2)
    assert (cached["forwards"], cached["graph_captures"], cache_speed.graph_captures(engine)) == (STEPS, 1, 3)
