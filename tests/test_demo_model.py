"""The shipped demo model (weights/demo, config `demo`): size limits, the engine parity
guarantees on the trained weights, and a short evaluation through the server."""
from pathlib import Path

import pytest
import torch

from h3_core.encoder import TextEncoder
from h3_core.engine import Engine, load_vaes
from h3_core.checkpoint import load_weights
from h3_core.config import get_config
from h3_core.model import H3DiT
from h3_core.request import RequestLimits
from h3_core.train import data
from h3_core.train.evaluate import evaluate
from h3_core.train.repository import DEMO_WEIGHTS

# The engine parity tests of test_engine.py, collected here again so they run with this
# module's `engine` fixture: the trained checkpoint instead of seeded random weights.
from tests.test_engine import (  # noqa: F401
    test_batch_order_does_not_matter,
    test_cobatched_mid_flight_admission_equals_solo,
    test_num_outputs_gives_consecutive_seeds_in_both_modes,
    test_request_mode_equals_step_mode,
)

FILES = ("dit.safetensors", "video_vae.safetensors", "audio_vae.safetensors")


@pytest.fixture(scope="module")
def engine():
    dit = H3DiT(get_config("demo"), row_tile=64)
    load_weights(dit, DEMO_WEIGHTS / "dit.safetensors")
    video_vae, audio_vae = load_vaes(DEMO_WEIGHTS)
    return Engine(dit.eval(), video_vae, audio_vae, TextEncoder(),
                  RequestLimits(max_height=128, max_width=128, max_num_frames=64, max_steps=20))


def test_shipped_weights_fit_the_size_limits():
    sizes = {name: (DEMO_WEIGHTS / name).stat().st_size for name in FILES}
    assert max(sizes.values()) <= 16 * 10**6 and sum(sizes.values()) <= 25 * 10**6, sizes
    files = sorted(p.name for p in Path(DEMO_WEIGHTS).iterdir())
    assert files == sorted(FILES)


def test_the_trained_weights_are_not_random(engine):
    # adaLN-zero training starts the output heads at 0; trained ones are not, and differ from
    # init_weights' seeded values.
    assert engine.dit.final_layer.video_out.weight.abs().max() > 0
    assert torch.isfinite(torch.cat([p.flatten() for p in engine.dit.parameters()])).all()


def test_short_evaluation_through_the_server():
    """Four held-out prompts (attribute combinations never trained on) through tritonserver,
    co-batched: the measured colour, direction, pitch and side match the prompt."""
    report = evaluate(data.held_out_clips()[:4], concurrency=4, log=lambda *_: None)
    assert report["n_clips"] == 4
    assert report["attribute_accuracy"] >= 0.9, report
