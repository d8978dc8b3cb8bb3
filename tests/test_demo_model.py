"""The shipped demo model (weights/demo, config `demo`): size limits, the engine parity
guarantees on the trained weights, its clips following their prompts in-process, and a short
evaluation through the server."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from client.api import H3Client
from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.diffusion.engine import RANDOM_PREVIEW, Engine
from h3_core.diffusion.request import GenerationRequest, RequestLimits
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.encoder import TextEncoder
from h3_core.model.initialization import init_weights
from h3_core.model.training_metadata import TRAINING_FILE
from h3_core.weights.checkpoint import CACHE_FILE, PREVIEW_FILE, load_preview, load_training_metadata, load_weights
from h3_core.weights.vae_hook import load_vaes
from server.process import TritonServer
from server.repository import DEMO_WEIGHTS, plan, write_repository
from tests.serving import ROOT

# The engine parity tests of test_engine.py, collected here again so they run with this
# module's `engine` fixture: the trained checkpoint instead of seeded random weights.
from tests.test_engine import (  # noqa: F401 - collected by pytest from this module
    test_batch_order_does_not_matter,
    test_cobatched_mid_flight_admission_equals_solo,
    test_num_outputs_gives_consecutive_seeds_in_both_modes,
    test_request_mode_equals_step_mode,
)
from training import data, evaluate, lora_train, preview_fit

FILES = (
    "dit.safetensors",
    "video_vae.safetensors",
    "audio_vae.safetensors",
    PREVIEW_FILE,
    TRAINING_FILE,
    CACHE_FILE,
    *lora_train.FILES.values(),  # the demo's LoRAs (docs/lora.md)
)


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
        load_preview(DEMO_WEIGHTS),
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


def test_training_json_is_the_training_data_and_names_what_is_outside_it():
    training = load_training_metadata(DEMO_WEIGHTS)
    metadata = data.training_metadata()
    assert training.sizes == {"height": (64,), "width": (96,), "num_frames": (22,)}
    assert training.caption == metadata["caption"] == data.CAPTION
    assert sorted(training.words) == metadata["words"] and len(training.words) == 26
    assert training.outside_size(64, 96, 22) == []
    assert training.outside_size(128, 96, 39) == ["height 128 (trained: 64)", "num_frames 39 (trained: 22)"]
    held_out = [c.caption for verb in range(3) for c in data.held_out_clips(verb)]
    assert [text for text in held_out if training.outside_words(text)] == []
    assert training.outside_words("A red Dragon flies to the left, a red dragon!") == ["words: 'dragon', 'flies'"]
    assert load_training_metadata(ROOT / "checkpoints" / "tiny") is None  # checkpoint_setup writes none
    assert load_training_metadata("random:0") is None


def test_the_demo_preview_is_the_fitted_map_applied_to_x0_hat(engine):
    """engine.preview_frame on the demo weights is the shipped map (5 x 5 cells of channels and
    channel products -> 8 x 8 px per cell, float16 in the file) applied to the middle latent
    frame of x0_hat: exactly PreviewMap.rgb, which agrees with the formula computed directly in
    float64; after the last step it is close to the rendered clip's middle frames (the fit's
    target); tiny's checkpoint and random:SEED fall back to RANDOM_PREVIEW."""
    shipped = load_file(DEMO_WEIGHTS / PREVIEW_FILE)
    assert {name: (tuple(t.shape), t.dtype) for name, t in shipped.items()} == {
        "weight": ((3, 8, 8, 324, 5, 5), torch.float16),
        "bias": ((3, 8, 8), torch.float16),
    }
    assert torch.equal(engine.preview.weight, shipped["weight"].float())
    assert torch.equal(engine.preview.bias, shipped["bias"].float())
    weight, bias = shipped["weight"].double(), shipped["bias"].double()
    i, j = torch.triu_indices(24, 24)
    clip = DISTINCT_CLIPS[0]  # a red ball
    request = GenerationRequest(clip.caption, data.HEIGHT, data.WIDTH, data.NUM_FRAMES, 8, seed=0)
    previews = []

    def check_preview(step, pack, velocities):
        ((state,), (velocity,)) = pack, velocities
        x0 = state.video_latents + state.sigmas_video[state.step_index] * velocity[0]
        latent = L.unpatchify_video(x0, state.layout)[:, state.layout.latent_t // 2]  # [24, 4, 6]
        rgb = engine.preview.rgb(latent)
        preview = engine.preview_frame(state, velocity[0])
        previews.append(preview)
        assert preview.shape == (32, 48, 3)
        assert torch.equal(preview, ((rgb * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8))
        # rgb[8y + a, 8x + b, c] = bias[c, a, b] + sum over k, dy, dx of
        # weight[c, a, b, k, dy, dx] * features[k, y + dy - 2, x + dx - 2] (zero outside)
        z = latent.double()
        features = torch.nn.functional.pad(torch.cat([z, z[i] * z[j]]), (2, 2, 2, 2))  # [324, 8, 10]
        windows = features.unfold(1, 5, 1).unfold(2, 5, 1)  # [324, 4, 6, 5, 5]
        direct = torch.einsum("cabkuv,kyxuv->yaxbc", weight, windows) + bias.permute(1, 2, 0)[None, :, None]
        torch.testing.assert_close(rgb.double(), direct.reshape(32, 48, 3), rtol=0, atol=1e-4)

    engine.run_to_completion(engine.prepare(request), on_step=check_preview)
    assert len(previews) == 8
    preview = previews[-1]
    # the clip's middle latent frame as the fit's target (group-mean frames, 2 x 2 px blocks)
    target = preview_fit.encode([clip], engine.video_vae)[1][0, 3]  # [3, 64, 96]
    target = ((torch.nn.functional.avg_pool2d(target, 2).permute(1, 2, 0) * 0.5 + 0.5) * 255).round()
    error = (preview.float() - target).pow(2).mean().sqrt()
    assert error < 20, error  # in 8-bit levels; measured 16.3
    tiny = load_engine("tiny", ROOT / "checkpoints" / "tiny", with_encoder=False, with_vaes=False)
    assert tiny.preview is RANDOM_PREVIEW and load_preview("random:0") is RANDOM_PREVIEW


def test_seeded_random_weights_fail_the_same_check(engine):
    """The check above on init_weights' seeded DiT (the trained VAEs kept): its clips do not
    follow the prompts (measured with the motion fine-tuned video VAE: colour green for the red
    prompt and red for the green one; down, medium, left for both), so the check can fail."""
    dit = H3DiT(get_config("demo"), row_tile=64)
    init_weights(dit, 0)
    accuracy = prompt_accuracy(Engine(dit.eval(), engine.video_vae, engine.audio_vae, engine.encoder, engine.limits))
    assert accuracy == {"colour": 0.0, "direction": 0.5, "pitch": 0.0, "side": 0.5}


TIMINGS = ("stage_seconds", "silent_s")  # seconds: not compared
INFO_KEYS = sorted(
    ["kind", "request_id", "output_index", "num_outputs", "seed", "height", "width", "num_frames"]
    + ["num_frames_requested"]
    + ["num_inference_steps", "largest_pack", "quantization", "task", "flow_shift", "audio_flow_shift"]
    + ["cache_threshold", "skipped_steps"]
)


def test_short_evaluation_through_the_server(tmp_path):
    """Four held-out prompts through tritonserver serving the demo repository, 4 in flight (so
    they are co-batched), scored like training.evaluate: the measured colour, direction, pitch
    and side match the prompt, and their INFO has no "outside_training"; then one request outside
    the weights' training.json (5 frames, words 'dragon' and 'flies'), whose INFO names both."""
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
        # outside the training data (training.json): the length, two words (h3_encoder's check)
        (outside,) = client.generate(
            "a red dragon flies to the left", num_frames=5, seed=0, request_id="outside", return_mp4=False
        )
    report = evaluate.report(clips, [(r.frames, r.audio) for r in results])
    assert report["n_clips"] == 4 and report["per_attribute"] == ALL_RIGHT, report
    assert [r.info["num_inference_steps"] for r in results] == [8] * 4
    assert [sorted(set(r.info) - set(TIMINGS)) for r in results] == [INFO_KEYS] * 4  # no outside_training
    assert {k: v for k, v in outside.info.items() if k not in TIMINGS} == {
        "kind": "result",
        "request_id": "outside",
        "output_index": 0,
        "num_outputs": 1,
        "seed": 0,
        "height": 64,
        "width": 96,
        "num_frames_requested": 5,
        "num_frames": 5,
        "num_inference_steps": 8,
        "largest_pack": 1,
        "quantization": "none",
        "cache_threshold": 0.0,
        "skipped_steps": 0,
        "task": "t2va",
        "flow_shift": 12.0,
        "audio_flow_shift": 3.0,
        "outside_training": ["num_frames 5 (trained: 22)", "words: 'dragon', 'flies'"],
    }
