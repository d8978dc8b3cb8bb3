"""A request's steps timed in-process, on one engine built as h3_dit builds it: the served
benchmark's (benchmarks/served_bench.py, scenario f) measure of what a served step adds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from h3_core.diffusion.request import GenerationRequest, RequestLimits  # noqa: E402 - after the sys.path set-up above
from h3_core.factory import load_engine  # noqa: E402 - after the sys.path set-up above


def synchronize(device: str) -> None:
    """Wait for the work queued on `device` ("cuda" or "cpu": nothing to wait for)."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed_loop(
    engine, request: GenerationRequest, text: torch.Tensor, device: str, per_step_sync: bool = False
) -> float:
    """Mean seconds per step of `request` stepped alone (Engine.run_to_completion) over all but
    its first 2 steps, which run untimed; the device synchronised before and after the timed
    steps, and after each one when per_step_sync."""
    starts = []

    @contextmanager
    def timed_step(step: int, states: list) -> Iterator[None]:
        if step == 2:
            synchronize(device)
            starts.append(time.perf_counter())
        yield
        if per_step_sync and step >= 2:
            synchronize(device)

    (state,) = engine.run_to_completion(engine.prepare(request, text), step_context=timed_step)
    synchronize(device)
    return (time.perf_counter() - starts[0]) / (state.total_steps - 2)


def in_process_step_loops(setting, checkpoint: Path, loops: dict, device: str) -> dict:
    """Seconds per step of one request's loop in-process, per entry name -> ((height, width,
    num_frames), steps) of `loops`, on one engine built as h3_dit builds it (load_engine; on CUDA
    compiled, its warm-up step run first: warm_up_seconds): the mean over `steps` steps of
    Engine.update(state, Engine.denoise_step([state])) after 2 warm-up steps, the device
    synchronised before and after the timed steps (the latents stay on the device, so the steps
    in between queue without waiting); measured with torch's default CPU threads
    (seconds_per_step), then with 1 (seconds_per_step_1_thread), then with the default threads
    and the device synchronised after every step (seconds_per_step_synced). The request's text
    states are setting.text_len random rows (the served prompt's length), so `rows` matches the
    served request's. setting: a served_bench.Setting (config, height, width, num_frames,
    text_len)."""
    engine = load_engine(
        setting.config,
        checkpoint,
        device,
        with_encoder=False,
        with_vaes=False,
        limits=RequestLimits(
            max_height=setting.height,
            max_width=setting.width,
            max_num_frames=setting.num_frames,
            max_steps=max(steps for _, steps in loops.values()) + 2,
            max_rows=2**20,
            max_request_mb=1 << 20,
        ),
    )
    warm_up_seconds = engine.warm_up()
    text = torch.randn(setting.text_len, engine.dit.cfg.text_dim, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    results = {}
    for name, ((height, width, num_frames), steps) in loops.items():
        request = GenerationRequest("in-process", height, width, num_frames, steps + 2, seed=0)
        result = {"seconds_per_step": timed_loop(engine, request, text, device), "cpu_threads": threads}
        result["steps"] = steps
        torch.set_num_threads(1)
        result["seconds_per_step_1_thread"] = timed_loop(engine, request, text, device)
        torch.set_num_threads(threads)
        result["seconds_per_step_synced"] = timed_loop(engine, request, text, device, per_step_sync=True)
        result["rows"] = engine.prepare(request, text)[0].rows
        result["shape"] = [height, width, num_frames]
        result["warm_up_seconds"] = warm_up_seconds
        results[name] = result
    del engine  # its GPU memory goes back before empty_cache
    if device == "cuda":
        torch.cuda.empty_cache()
    return results
