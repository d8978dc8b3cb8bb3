"""A synthetic checkpoint in the official MiniMax-H3 layout (h3_core.weights.official_checkpoint: tiny DiT
in diffusers names, a 52-layer random Qwen3-VL cut at layer 50, its tokenizer, our VAEs behind the
remote-code hook) served end to end through tritonserver on the CPU, equal bit for bit to the
same models run in-process."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from client.api import H3Client
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine
from h3_core.model.encoder import QWEN3VL_H3_LAYER, TextEncoder
from h3_core.protocol import PROMPT, TEXT_EMBEDS
from h3_core.weights.official_checkpoint import QWEN3VL_LAYERS, TEXT_ENCODER, TOKENIZER, write_synthetic_checkpoint
from server.process import TritonServer
from server.repository import check_checkpoint, plan, write_repository
from tests.serving import raw_stream, tensor

PROMPTS = ("a red ball rolls", "rain on a tin roof at night, far thunder", "é")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("official") / "h3-synthetic", "tiny")


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    repository = plan("tiny", checkpoint, overrides={"h3_vae": {"trust_remote_code": True}})
    folder = write_repository(tmp_path_factory.mktemp("repo") / "model_repository", repository)
    with TritonServer(folder, free_ports=True) as running:
        yield running


def test_layout_and_writer_settings(checkpoint):
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "audio_vae",
        "text_encoder",
        "tokenizer",
        "transformer",
        "video_vae",
    ]
    text_config = json.loads((checkpoint / TEXT_ENCODER / "config.json").read_text())["text_config"]
    assert text_config["num_hidden_layers"] == QWEN3VL_LAYERS == 52 and text_config["hidden_size"] == 384
    repository = plan("tiny", checkpoint, overrides={"h3_vae": {"trust_remote_code": True}})
    assert repository.encoder.encoder_path == str(checkpoint / TEXT_ENCODER)
    assert repository.encoder.tokenizer_path == str(checkpoint / TOKENIZER)
    assert repository.encoder.hidden_layer == QWEN3VL_H3_LAYER == 50
    assert repository.dit.checkpoint_dir == repository.vae.checkpoint_dir == str(checkpoint)
    with pytest.raises(
        ValueError,
        match=r"video_vae holds remote code \(modeling_h3_vae\.py\); the h3_vae model parameter trust_remote_code "
        r'must be "true" to run it',
    ):
        check_checkpoint(plan("tiny", checkpoint).dit, plan("tiny", checkpoint).vae, plan("tiny", checkpoint).encoder)
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        write_synthetic_checkpoint(checkpoint)
    with pytest.raises(
        ValueError,
        match=r"^config h3 has 33,122,992,896 parameters: a synthetic checkpoint drawn on the CPU is for configs of "
        r"at most 1,000,000,000 \(tiny, small, demo\); draw it on a GPU \(device cuda\), or serve h3 without a "
        r"file with --checkpoint random:0$",
    ):
        write_synthetic_checkpoint(checkpoint.parent / "h3", "h3", text_encoder="h3")


def test_writer_text_encoder_options(checkpoint, tmp_path):
    """--text-encoder-layers sets the Qwen3-VL's depth and leaves the DiT as it was; text encoders
    of another width than the DiT's, unknown ones and no layers are refused, naming them."""
    two = write_synthetic_checkpoint(tmp_path / "two", "tiny", text_encoder="tiny", text_encoder_layers=2)
    text_config = json.loads((two / TEXT_ENCODER / "config.json").read_text())["text_config"]
    assert (text_config["num_hidden_layers"], text_config["hidden_size"]) == (2, 384)
    dit_file = "transformer/diffusion_pytorch_model.safetensors"
    ours, default = load_file(str(two / dit_file)), load_file(str(checkpoint / dit_file))
    assert ours.keys() == default.keys() and all(torch.equal(ours[name], default[name]) for name in ours)
    encoder = TextEncoder(str(two / TEXT_ENCODER), 2, tokenizer_path=str(two / TOKENIZER))
    assert encoder.encode(PROMPTS[0]).shape == (16, 384)
    for options, message in (
        (
            {"text_encoder": "h3"},
            "text_encoder h3 gives 5120-wide states but config tiny reads 384-wide ones: choose text_encoder tiny "
            "or a config of text width 5120 (bench, h3)",
        ),
        ({"text_encoder": "large"}, "text_encoder 'large' is not one of ['tiny', 'h3']"),
        ({"text_encoder_layers": 0}, "text_encoder_layers=0 is out of range: allowed >= 1"),
    ):
        with pytest.raises(ValueError) as caught:
            write_synthetic_checkpoint(tmp_path / "refused", "tiny", **options)
        assert str(caught.value) == message
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize(
    "device, message",
    [
        ("meta", "--device meta: choose cpu, or cuda / cuda:N on a machine with a CUDA GPU"),
    ],
)
def test_writer_command_refuses_a_bad_device(tmp_path, device, message):
    command = [sys.executable, "-m", "h3_core.weights.official_checkpoint", str(tmp_path / "c"), "--device", device]
    run = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 2 and run.stderr.splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "c").exists()


def test_served_clip_equals_in_process(server, checkpoint):
    request = GenerationRequest(PROMPTS[1], 64, 96, 22, 3, seed=7)
    (served,) = H3Client(server.grpc_url).generate(
        request.prompt,
        height=request.height,
        width=request.width,
        num_frames=request.num_frames,
        num_inference_steps=request.num_inference_steps,
        seed=request.seed,
        return_mp4=False,
        return_frames=True,
        return_audio=True,
    )
    encoder = TextEncoder(str(checkpoint / TEXT_ENCODER), QWEN3VL_H3_LAYER, tokenizer_path=str(checkpoint / TOKENIZER))
    engine = load_engine("tiny", checkpoint, with_encoder=False, trust_remote_code=True)
    ((_, frames, audio),) = engine.generate(request, encoder.encode(request.prompt))
    assert served.frames.shape == (22, 64, 96, 3) and served.audio.shape == (2, 29333)
    assert torch.equal(torch.from_numpy(served.frames.copy()), frames)
    assert torch.equal(torch.from_numpy(served.audio.copy()), audio)


def test_concurrent_prompts_get_their_solo_states(server, checkpoint):
    """Prompts of different lengths sent to h3_encoder at once (streamed: it is decoupled): each
    gets exactly the states it gets alone (the encoder runs one prompt per forward: nothing is
    padded)."""
    encoder = TextEncoder(str(checkpoint / TEXT_ENCODER), QWEN3VL_H3_LAYER, tokenizer_path=str(checkpoint / TOKENIZER))
    served = []

    def encode(prompt):
        value = np.array([[prompt.encode()]], dtype=object)
        (response,), error = raw_stream(server.grpc_url, [tensor(PROMPT, value, "BYTES")], model="h3_encoder")
        assert error is None, error
        served.append((prompt, response.as_numpy(TEXT_EMBEDS)))

    threads = [threading.Thread(target=encode, args=(prompt,)) for prompt in PROMPTS * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(prompt for prompt, _ in served) == sorted(PROMPTS * 2)
    for prompt, states in served:
        solo = encoder.encode(prompt)
        assert solo.shape == (len(prompt.encode()), 384)
        assert torch.equal(torch.from_numpy(states[0].copy()), solo)


@pytest.mark.parametrize("keyframes", [(0,), (-1,), (0, -1)], ids=["first", "last", "both"])
def test_served_fl2va_clip_equals_in_process(server, checkpoint, keyframes):
    """fl2va on the synthetic official checkpoint: Qwen3-VL presents the keyframes with its vision
    tower (<Picture i>: + vision tokens, then the prompt), the official VAE hook encodes them, and
    the served clip equals the in-process one (the same encoder, hook and DiT) bit for bit."""
    import io

    import numpy as np
    from PIL import Image

    from h3_core.diffusion.conditions import Condition
    from h3_core.model.vae import keyframe_latent

    images = [np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8) for seed in (1, 2)]
    files = []
    for image in images:
        out = io.BytesIO()
        Image.fromarray(image).save(out, format="PNG")
        files.append(out.getvalue())
    request = GenerationRequest(PROMPTS[0], 64, 96, 9, 2, seed=3, task="fl2va")
    images = [image for image, frame in zip(images, (0, -1), strict=True) if frame in keyframes]
    given = dict(zip(("first_frame", "last_frame"), files, strict=True))
    (served,) = H3Client(server.grpc_url).generate(
        request.prompt,
        height=64,
        width=96,
        num_frames=9,
        num_inference_steps=2,
        seed=3,
        first_frame=given["first_frame"] if 0 in keyframes else None,
        last_frame=given["last_frame"] if -1 in keyframes else None,
        return_mp4=False,
        return_frames=True,
        return_audio=True,
    )
    encoder = TextEncoder(str(checkpoint / TEXT_ENCODER), QWEN3VL_H3_LAYER, tokenizer_path=str(checkpoint / TOKENIZER))
    embeds, spans = encoder.encode_presentation(request.prompt, images)
    assert len(spans) == len(keyframes) and served.info["task"] == "fl2va"
    assert served.info["conditions"] == [{"kind": "keyframe", "frame": frame} for frame in keyframes]
    engine = load_engine("tiny", checkpoint, with_encoder=False, trust_remote_code=True)
    conditions = [
        Condition("keyframe", frame, keyframe_latent(engine.video_vae, torch.from_numpy(image))[:, None])
        for frame, image in zip(keyframes, images, strict=True)
    ]
    ((_, frames, audio),) = engine.generate(request, embeds, conditions, tuple(spans))
    assert torch.equal(torch.from_numpy(served.frames.copy()), frames)
    assert torch.equal(torch.from_numpy(served.audio.copy()), audio)


def test_served_ref2va_clip_equals_in_process(server, checkpoint):
    """ref2va on the synthetic official checkpoint: a guide, an image, a video with its audio and
    an audio clip; Qwen3-VL presents the images and the video with its vision tower, the official
    VAE hook encodes them all, and the served clip equals the in-process one bit for bit."""
    from h3_core.protocol import GUIDES, REFERENCE_AUDIO, REFERENCE_IMAGES, REFERENCE_VIDEOS
    from h3_core.serving.encoder.conditioning import read_references, reference_conditions
    from h3_core.serving.shared.settings import EncoderSettings
    from tests.test_fl2va_serving import png
    from tests.test_ref2va_serving import mp4, tone

    files = {
        GUIDES: [png(64, 96, 1)],
        REFERENCE_IMAGES: [png(64, 64, 2)],
        REFERENCE_VIDEOS: [mp4(24, seed=3)],
        REFERENCE_AUDIO: [tone(2.0, seed=4)],
    }
    request = GenerationRequest(PROMPTS[2], 64, 96, 9, 2, seed=5, task="ref2va")
    (served,) = H3Client(server.grpc_url).generate(
        request.prompt,
        height=64,
        width=96,
        num_frames=9,
        num_inference_steps=2,
        seed=5,
        guides=[(files[GUIDES][0], 4)],
        reference_images=files[REFERENCE_IMAGES],
        reference_videos=files[REFERENCE_VIDEOS],
        reference_audio=files[REFERENCE_AUDIO],
        return_mp4=False,
        return_frames=True,
        return_audio=True,
    )
    # in process with the served models' one CPU thread (cpu_threads 1): the audio VAE's conv1d
    # sums differently when two threads split it
    threads = torch.get_num_threads()
    torch.set_num_threads(EncoderSettings().cpu_threads)
    try:
        refs = read_references(files, [4], 64, 96, 9, 1, None, EncoderSettings(), (64, 96))
        encoder = TextEncoder(
            str(checkpoint / TEXT_ENCODER), QWEN3VL_H3_LAYER, tokenizer_path=str(checkpoint / TOKENIZER)
        )
        images = [image for _, image in refs.guides] + refs.images
        embeds, spans = encoder.encode_references(request.prompt, images, [frames for frames, _ in refs.videos], 1)
        engine = load_engine("tiny", checkpoint, with_encoder=False, trust_remote_code=True)
        conditions = reference_conditions(engine.video_vae, engine.audio_vae, refs)
        ((_, frames, audio),) = engine.generate(request, embeds, conditions, tuple(spans))
    finally:
        torch.set_num_threads(threads)
    assert len(spans) >= 3 and served.info["task"] == "ref2va"
    assert torch.equal(torch.from_numpy(served.frames.copy()), frames)
    assert torch.equal(torch.from_numpy(served.audio.copy()), audio)
