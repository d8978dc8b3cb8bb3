"""The demo's shipped LoRAs (weights/demo/turbo_lora.safetensors, style_lora.safetensors;
training/lora_train.py, docs/lora.md §"The demo's LoRAs"): they read through read_lora with their
metadata, the turbo's 2-step clip reproduces its recorded PSNR against the base's 8-step clip in
the engine, the style adapter at scale 0 is the base bit for bit, and a trained delta is what the
file serves."""

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion.request import GenerationRequest
from h3_core.diffusion.sampling import default_sigmas
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.weights.lora_formats import lora_targets, read_lora
from server.repository import DEMO_WEIGHTS
from training import data, lora_train
from training.lora_evaluate import median_frame_psnr

DEMO = get_config("demo")
# turbo 2-step against base 8-step, held-out clip 0 ('a red ball rolls to the left while a medium tone
# plays on the left'), seed 0, one request alone: training.lora_evaluate's median_frame_psnr, recorded on the
# 2-core development CPU (the base at 2 steps: 33.69 dB). The frames are uint8 after float32 sampling and
# decoding; another CPU's float32 GEMMs round differently (relative 1e-6), which flips a pixel by one level
# only where a value sits that close to a rounding edge: a handful per frame. At ~43 dB a 64 x 96 frame's
# squared error is ~55,000 and 0.01 dB is 0.23 % of it, ~30 one-level flips in the median frame.
TURBO2_PSNR_CLIP0_DB = 43.4757


@pytest.fixture(scope="module")
def engine():
    engine = load_engine("demo", DEMO_WEIGHTS)
    for name, file in lora_train.FILES.items():
        engine.add_lora(name, read_lora(DEMO_WEIGHTS / file, DEMO))
    return engine


def test_shipped_loras_read_with_their_metadata():
    expected = sorted(f"blocks.{i}.{t}" for i in range(DEMO.num_layers) for t in lora_train.TARGETS)
    for name, file in lora_train.FILES.items():
        adapter = read_lora(DEMO_WEIGHTS / file, DEMO)
        assert adapter.format == "flashgen"
        assert sorted(adapter.targets) == expected
        assert adapter.rank == 16 and {t.alpha for t in adapter.targets.values()} == {16.0}
        assert adapter.metadata["trained_by"] == "training.lora_train"
        shapes = lora_targets(DEMO)
        for target, pair in adapter.targets.items():
            out, width = shapes[target]
            assert pair.a.shape == (16, width) and pair.b.shape == (out, 16) and pair.a.dtype == torch.float32
        assert adapter.base_schedule == ("[1, 0.5, 0]" if name == "turbo" else None)
    turbo_video, turbo_audio = default_sigmas(read_lora(DEMO_WEIGHTS / "turbo_lora.safetensors", DEMO).base_schedule)
    assert [round(s, 5) for s in turbo_video] == [1.0, 0.92308, 0.0]
    assert [round(s, 5) for s in turbo_audio] == [1.0, 0.75, 0.0]


def run(engine, steps: int, lora=(), sigmas=None, decode: bool = True):
    clip = data.held_out_clips()[0]
    request = GenerationRequest(
        clip.caption,
        data.HEIGHT,
        data.WIDTH,
        data.NUM_FRAMES,
        steps,
        0,
        video_sigmas=None if sigmas is None else sigmas[0],
        audio_sigmas=None if sigmas is None else sigmas[1],
        lora=lora,
    )
    return engine.run_to_completion(engine.prepare(request), decode=decode)[0]


def test_turbo_two_steps_reproduce_the_recorded_psnr(engine):
    _, base_frames, _ = run(engine, 8)
    sigmas = default_sigmas(lora_train.TURBO_SCHEDULE)
    _, turbo_frames, _ = run(engine, 2, (("turbo", 1.0),), sigmas)
    _, base2_frames, _ = run(engine, 2, (), sigmas)
    turbo = median_frame_psnr([(turbo_frames.numpy(), None)], [(base_frames.numpy(), None)])
    base2 = median_frame_psnr([(base2_frames.numpy(), None)], [(base_frames.numpy(), None)])
    assert turbo == pytest.approx(TURBO2_PSNR_CLIP0_DB, abs=0.01), (turbo, base2)
    assert base2 < turbo - 2.0


def test_style_at_scale_zero_is_the_base_bit_for_bit(engine):
    base = run(engine, 2, decode=False)
    zero = run(engine, 2, (("style", 0.0),), decode=False)
    style = run(engine, 2, (("style", 1.0),), decode=False)
    assert torch.equal(zero.video_latents, base.video_latents) and torch.equal(zero.audio_latents, base.audio_latents)
    assert not torch.equal(style.video_latents, base.video_latents)


def test_trained_delta_is_what_the_saved_file_serves(tmp_path):
    """LoraDelta's hook on a linear equals the base linear plus read_lora's LoraTarget.delta of its file."""
    tiny = get_config("tiny")
    model = H3DiT(tiny, row_tile=0)
    init_weights(model, 0)
    delta = lora_train.LoraDelta(model, rank=4, alpha=8.0, seed=1)
    with torch.no_grad():
        for b in delta.b:
            b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(b.shape[0])))
    x = torch.randn(5, tiny.hidden_size, generator=torch.Generator().manual_seed(2))
    fc1 = model.get_submodule("blocks.1.mlp.fc1")
    base = fc1(x)
    handles = delta.attach(model)
    hooked = fc1(x)
    delta.save(tmp_path / "a.safetensors", "[1, 0]")
    adapter = read_lora(tmp_path / "a.safetensors", tiny)
    assert adapter.base_schedule == "[1, 0]" and adapter.rank == 4
    assert torch.equal(hooked, base + adapter.targets["blocks.1.mlp.fc1"].delta(x))
    for handle in handles:
        handle.remove()
    assert torch.equal(fc1(x), base)


def test_style_clips_draw_the_shape_brighter():
    clip = data.Clip("red", "square", "left", "low", "left")
    plain, bright = data.render_video([clip])[0, 0], data.render_video([clip], lift=lora_train.STYLE_LIFT)[0, 0]
    x, y, _ = data.trajectory(clip)
    centre = (round(float(y[0])), round(float(x[0])))
    assert plain[centre].tolist() == [220, 50, 50] and bright[centre].tolist() == [255, 125, 125]
    assert torch.equal(plain[0, 0], bright[0, 0]) and plain[0, 0].tolist() == list(data.BACKGROUND)
