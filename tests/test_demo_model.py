"""The shipped demo model (weights/demo, config `demo`): size limits, the engine parity
guarantees on the trained weights, its clips following their prompts in-process, and a short
evaluation through the server."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from client.api import H3Client
from h3_core.config import get_config
from h3_core.diffusion.engine import Engine
from h3_core.diffusion.request import RequestLimits
from h3_core.model import H3DiT
from h3_core.model.encoder import TextEncoder
from h3_core.model.initialization import init_weights
from h3_core.weights.checkpoint import load_weights
from h3_core.weights.vae_hook import load_vaes
from server.process import TritonServer
from server.repository import DEMO_WEIGHTS, plan, write_repository

# The engine parity tests of test_engine.py, collected here again so they run with this
# module's `engine` fixture: the trained checkpoint instead of seeded random weights.
from tests.test_engine import (  # noqa: F401 - collected by pytest from this module
    test_batch_order_does_not_matter,
    test_cobatched_mid_flight_admission_equals_solo,
    test_num_outputs_gives_consecutive_seeds_in_both_modes,
    test_request_mode_equals_step_mode,
)
from training import data, evaluate

FILES = ("dit.safetensors", "video_vae.safetensors", "audio_vae.safetensors")


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("demo"), row_tile=64)
    load_weights(dit, DEMO_WEIGHTS / "dit.safetensors")
    video_vae, audio_vae = load_vaes(DEMO_WEIGHTS)
    return Engine(
        dit.eval(),
        video_vae,
        audio_vae,
        TextEncoder(),
        RequestLimits(max_height=128, max_width=128, max_num_frames=64, max_steps=20),
    )


def test_shipped_weights_fit_the_size_limits():
    sizes = {name: (DEMO_WEIGHTS / name).stat().st_size for name in FILES}
    assert max(sizes.values()) <= 16 * 10**6 and sum(sizes.values()) <= 25 * 10**6, sizes
    files = sorted(p.name for p in Path(DEMO_WEIGHTS).iterdir())
    assert files == sorted(FILES)


# Two held-out prompts (attribute combinations never trained on) that differ in every scored
# attribute: colour red / green, direction left / down, pitch low / high, side right / left. A
# model whose clips ignore the prompt gets at most one of each pair right.
DISTINCT_CLIPS = [data.held_out_clips()[0], data.held_out_clips()[5]]
ALL_RIGHT = {"colour": 1.0, "direction": 1.0, "pitch": 1.0, "side": 1.0}


def prompt_accuracy(engine: Engine) -> dict:
    """training.evaluate's per-attribute accuracy of DISTINCT_CLIPS (seed 0, 8 steps, co-batched)."""
    outputs = evaluate.generate(engine, DISTINCT_CLIPS, 8, seed=0, pack=2)
    return evaluate.report(DISTINCT_CLIPS, outputs)["per_attribute"]


def test_the_trained_weights_are_not_random(engine):
    assert [(c.colour, c.direction, c.pitch, c.side) for c in DISTINCT_CLIPS] == [
        ("red", "left", "low", "right"),
        ("green", "down", "high", "left"),
    ]
    assert prompt_accuracy(engine) == ALL_RIGHT


def test_seeded_random_weights_fail_the_same_check(engine):
    """The check above on init_weights' seeded DiT (the trained VAEs kept): its clips do not
    follow the prompts (measured: red, down, medium, left for both), so the check can fail."""
    dit = H3DiT(get_config("demo"), row_tile=64)
    init_weights(dit, 0)
    accuracy = prompt_accuracy(Engine(dit.eval(), engine.video_vae, engine.audio_vae, engine.encoder, engine.limits))
    assert accuracy == {"colour": 0.5, "direction": 0.5, "pitch": 0.0, "side": 0.5}


def test_short_evaluation_through_the_server(tmp_path):
    """Four held-out prompts through tritonserver serving the demo repository, 4 in flight (so
    they are co-batched), scored like training.evaluate: the measured colour, direction, pitch
    and side match the prompt."""
    clips = data.held_out_clips()[:4]
    repository = write_repository(tmp_path / "model_repository", plan("demo", DEMO_WEIGHTS))
    with TritonServer(repository, free_ports=True, log_file=tmp_path / "server.log") as server:
        client = H3Client(server.grpc_url, idle_timeout_s=600)

        def run(clip: data.Clip):
            (result,) = client.generate(
                clip.caption,
                height=data.HEIGHT,
                width=data.WIDTH,
                num_frames=data.NUM_FRAMES,
                seed=0,
                return_mp4=False,
                return_frames=True,
                return_audio=True,
            )
            return result

        with ThreadPoolExecutor(len(clips)) as pool:
            results = list(pool.map(run, clips))
    report = evaluate.report(clips, [(r.frames, r.audio) for r in results])
    assert report["n_clips"] == 4 and report["per_attribute"] == ALL_RIGHT, report
    assert [r.info["num_inference_steps"] for r in results] == [8] * 4
