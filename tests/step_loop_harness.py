"""The step loop's test harness (tests/test_step_loop*.py): a tiny engine (the module fixture
`engine`), h3_dit's inputs as plain Arrivals (Client), a fake clock (Clock) and each request's
solo run to compare a result with (assert_solo: torch.equal of the final latents)."""

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import GenerationRequest
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.serving.dit.events import Arrival, Result
from h3_core.serving.dit.metrics import MetricsRecord
from h3_core.serving.dit.step_loop import StepLoop
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings

TEXT_LEN = 3
TEXT_DIM = get_config("tiny").text_dim


def tiny_engine() -> Engine:
    """The tiny DiT with seeded weights (seed 0), row_tile 64, in an Engine without VAEs: each
    step-loop test module's `engine` fixture."""
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    return Engine(dit.eval(), None, None)


def text(seed: int) -> np.ndarray:
    """TEXT_EMBEDS float32 [1, TEXT_LEN, TEXT_DIM], seeded."""
    return torch.randn(1, TEXT_LEN, TEXT_DIM, generator=torch.Generator().manual_seed(seed)).numpy()


def fields(steps: int, seed: int, **extra) -> list[bytes]:
    return [
        json.dumps(
            {"height": 32, "width": 64, "num_frames": 5, "num_inference_steps": steps, "seed": seed, **extra}
        ).encode()
    ]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Client:
    """Stands for Triton: keeps every live request's Arrival, delivers them all each iteration
    (as the iterative sequence batcher does), collects events per request id."""

    def __init__(self, loop: StepLoop):
        self.loop, self.live, self.events, self.keys = loop, {}, [], iter(range(1, 10**6))

    def send(
        self,
        request_id: str,
        steps: int = 3,
        seed: int = 1,
        parameters: dict | None = None,
        text_embeds: np.ndarray | None = None,
        condition_latents: np.ndarray | None = None,
        **extra,
    ) -> str:
        """Queue a new request: REQUEST fields 64x32x5 unless extra overrides them (conditions=[...]
        with condition_latents float32 [1, N] for fl2va / ref2va), TEXT_EMBEDS float32
        [1, L, text_dim] (text(seed) unless given)."""
        key = next(self.keys)
        self.live[key] = Arrival(
            handle=key,
            key=key,
            request_id=request_id,
            new=True,
            request_json=fields(steps, seed, **extra),
            text_embeds=text(seed) if text_embeds is None else text_embeds,
            condition_latents=condition_latents,
            parameters_json=json.dumps(parameters or {}),
        )
        return request_id

    def cancel(self, target: str) -> None:
        key = next(self.keys)
        self.live[key] = Arrival(
            handle=key,
            key=key,
            request_json=[json.dumps({"cancel_request_id": target}).encode()],
            text_embeds=np.zeros((1, 0, 0), np.float32),
        )

    def iterate(self, withhold: tuple = ()) -> list:
        sent = []
        arrivals = [arrival for key, arrival in self.live.items() if key not in withhold]
        reschedule = self.loop.iterate(arrivals, sent.append)
        for key in list(self.live):
            if key in withhold:
                continue
            if key in reschedule:
                self.live[key].new = False
            else:
                del self.live[key]
        self.events += sent
        return sent

    def run(self, limit: int = 50) -> None:
        for _ in range(limit):
            if not self.live:
                return
            self.iterate()
        raise AssertionError("requests still live")

    def of(self, request_id: str, kind=object) -> list:
        return [
            event
            for event in self.events
            if isinstance(event, kind) and getattr(event, "request_id", None) == request_id
        ]


def live_ids(registry: Registry) -> list[str]:
    """The request ids the registry holds live, on any instance."""
    with registry._thread_lock:
        return [row[0] for row in registry._db.execute("SELECT request_id FROM live ORDER BY request_id")]


def make_loop(engine, clock=None, registry=None, **settings) -> StepLoop:
    """A loop with its own registry folder unless one is given (instances of one server share one).
    One step per iterate unless execute_budget_s is given: the fake clock stands still, so any
    budget would let an execute run its requests to completion."""
    registry = registry or Registry(Path(tempfile.mkdtemp()), "i0")
    settings = {"max_steps": 20, "execute_budget_s": 0.0, **settings}
    return StepLoop(engine, DitSettings(**settings), registry, MetricsRecord(), clock or Clock())


def joins_by_step(prepare, arrivals) -> dict:
    """Engine.run_to_completion's joins for (step, item) arrivals: at each step its items, in the
    order given, prepared then (prepare(item) -> a list of RequestState)."""
    by_step = {}
    for step, item in arrivals:
        by_step.setdefault(step, []).append(item)
    return {step: lambda items=items: [s for item in items for s in prepare(item)] for step, items in by_step.items()}


def solo_latents(engine, steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    request = GenerationRequest("-", 32, 64, 5, steps, seed=seed)
    (state,) = engine.run_to_completion(engine.prepare(request, torch.from_numpy(text(seed)[0])))
    return L.unpatchify_video(state.video_latents, state.layout), L.audio_rows_to_latent(
        state.audio_latents, state.layout
    )


def assert_solo(engine, result: Result, steps: int, seed: int) -> None:
    video, audio = solo_latents(engine, steps, seed)
    assert torch.equal(result.video_latent, video) and torch.equal(result.audio_latent, audio)


def timed_forwards(monkeypatch, loop: StepLoop, clock: Clock, before=None, seconds: float = 1.0) -> list:
    """Make every packed forward of `loop` take `seconds` (1 s: steps in lockstep,
    OVERLAP_MAX_STEP_S) on the fake clock. Returns the log of forwards, (clock at its start,
    request ids of its pack) each; before(n), if given, runs at the start of the n-th forward
    (n from 0)."""
    forward, log = loop.forward, []

    def timed(jobs):
        if before is not None:
            before(len(log))
        log.append((clock.now, [job.request_id for job in jobs]))
        clock.now += seconds
        return forward(jobs)

    monkeypatch.setattr(loop, "forward", timed)
    return log
