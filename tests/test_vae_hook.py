import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from h3_core.config import get_config
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.vae import create_vaes
from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings
from h3_core.weights import remote_vae_modeling
from h3_core.weights.checkpoint import save_official_transformer, save_weights
from h3_core.weights.official_checkpoint import tiny_qwen3vl, write_byte_tokenizer, write_random_qwen3vl
from h3_core.weights.vae_hook import load_vaes, write_official_vaes
from server import repository as R

REFUSAL = (
    '{} holds remote code (modeling_h3_vae.py); the h3_vae model parameter trust_remote_code must be "true" to '
    "run it (python -m server.launch ... --set h3_vae.trust_remote_code=true)"
)

# Hook variants for the output-shape rules, written next to the copied modeling_h3_vae.py.
CUSTOM_MODULE = """
import torch
from h3_core.weights.remote_vae_modeling import H3AudioVAE, H3VideoVAE


class Output:
    def __init__(self, sample):
        self.sample = sample


class SampleVideo(H3VideoVAE):
    def decode(self, z):
        return Output(super().decode(z))


class FlatAudio(H3AudioVAE):
    def decode(self, z):
        return super().decode(z)[:, 0]


class ShortVideo(H3VideoVAE):
    def decode(self, z):
        return super().decode(z)[:, :, :5]


class ListAudio(H3AudioVAE):
    def decode(self, z):
        return super().decode(z).tolist()


class HalfVideo(H3VideoVAE):
    def encode(self, x):
        return super().encode(x)[:, :12]


class NanAudio(H3AudioVAE):
    def encode(self, x):
        z = super().encode(x)
        z[1, 0, -1] = float("nan")
        return z

    def decode(self, z):
        return super().decode(z) / 0.0


class NotAModule:
    @classmethod
    def from_pretrained(cls, folder):
        return cls()
"""


@pytest.fixture(scope="module")
def vaes():
    """Seeded VAEs with non-trivial latent statistics (the hook applies them, not the model)."""
    video_vae, audio_vae = create_vaes(1)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for vae in (video_vae, audio_vae):
            channels = vae.latents_mean.shape[0]
            vae.latents_mean.copy_(torch.randn(channels, generator=generator))
            vae.latents_std.copy_(0.5 + torch.rand(channels, generator=generator))
    return video_vae, audio_vae


@pytest.fixture(scope="module")
def official(tmp_path_factory, vaes):
    folder = tmp_path_factory.mktemp("official")
    write_official_vaes(folder, *vaes)
    return folder


def copy_with(tmp_path, official, video_class=None, audio_class=None):
    """A copy of the official VAE folders whose config.json names CUSTOM_MODULE's classes."""
    for name, class_name in (("video_vae", video_class), ("audio_vae", audio_class)):
        shutil.copytree(official / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        if class_name:
            (tmp_path / name / "custom_vae.py").write_text(CUSTOM_MODULE)
            edit_config(tmp_path / name, lambda c, n=class_name: c["auto_map"].update(AutoModel=f"custom_vae.{n}"))
    return tmp_path


def edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def test_written_folders_follow_the_hook_contract(official, vaes):
    for name, vae, class_name in (("video_vae", vaes[0], "H3VideoVAE"), ("audio_vae", vaes[1], "H3AudioVAE")):
        folder = official / name
        config = json.loads((folder / "config.json").read_text())
        assert config == {
            "auto_map": {"AutoModel": f"modeling_h3_vae.{class_name}"},
            "latents_mean": vae.latents_mean.tolist(),
            "latents_std": vae.latents_std.tolist(),
        }
        assert (folder / "modeling_h3_vae.py").read_text() == Path(remote_vae_modeling.__file__).read_text()
        weights = load_file(str(folder / "model.safetensors"))
        assert sorted(weights) == sorted(
            [*(f"encoder.{k}" for k in vae.encoder.state_dict()), *(f"decoder.{k}" for k in vae.decoder.state_dict())]
        )
        assert torch.equal(weights["encoder.0.weight"], vae.encoder[0].weight)
        assert torch.equal(weights["decoder.0.weight"], vae.decoder[0].weight)


def test_remote_code_is_refused_without_opt_in(official):
    with pytest.raises(ValueError, match=f"^{re.escape(REFUSAL.format(official / 'video_vae'))}$"):
        load_vaes(official)
    with pytest.raises(ValueError, match=f"^{re.escape(REFUSAL.format(official / 'video_vae'))}$"):
        R.check_checkpoint(
            DitSettings(checkpoint_dir="random:0"), VaeSettings(checkpoint_dir=str(official)), EncoderSettings()
        )
    R.check_checkpoint(
        DitSettings(checkpoint_dir="random:0"),
        VaeSettings(checkpoint_dir=str(official), trust_remote_code=True),
        EncoderSettings(),
    )


@pytest.mark.parametrize("video_shape, audio_frames", [((24, 2, 1, 1), 1), ((24, 7, 3, 4), 9), ((24, 12, 2, 2), 25)])
def test_decoding_through_the_hook_equals_our_vaes(official, vaes, video_shape, audio_frames):
    hook_video, hook_audio = load_vaes(official, trust_remote_code=True)
    generator = torch.Generator().manual_seed(video_shape[1])
    video = torch.randn(video_shape, generator=generator)
    audio = torch.randn(2, 32, audio_frames, generator=generator)
    frames = hook_video.decode(video)
    assert frames.dtype == torch.uint8 and torch.equal(frames, vaes[0].decode(video))
    waveform = hook_audio.decode(audio)
    assert waveform.dtype == torch.float32 and torch.equal(waveform, vaes[1].decode(audio))


@pytest.mark.parametrize("num_frames, height, width, audio_frames", [(5, 16, 16, 1), (22, 48, 64, 9), (39, 32, 32, 25)])
def test_encoding_through_the_hook_equals_our_vaes(official, vaes, num_frames, height, width, audio_frames):
    hook_video, hook_audio = load_vaes(official, trust_remote_code=True)
    generator = torch.Generator().manual_seed(num_frames)
    frames = torch.randint(0, 256, (num_frames, height, width, 3), dtype=torch.uint8, generator=generator)
    audio = torch.rand(2, audio_frames * 800, generator=generator) * 2 - 1
    latent = hook_video.encode(frames)
    assert latent.shape == (24, (num_frames - 5) // 17 * 5 + 2, height // 16, width // 16)
    assert latent.dtype == torch.float32 and torch.equal(latent, vaes[0].encode(frames))
    audio_latent = hook_audio.encode(audio)
    assert audio_latent.shape == (2, 32, audio_frames)
    assert audio_latent.dtype == torch.float32 and torch.equal(audio_latent, vaes[1].encode(audio))


@pytest.mark.parametrize(
    "frames, audio",
    [
        (torch.zeros(5, 16, 16, 3), torch.zeros(2, 800, dtype=torch.float64)),
        (torch.zeros(5, 16, 16, 4, dtype=torch.uint8), torch.zeros(1, 800)),
        (torch.zeros(6, 16, 16, 3, dtype=torch.uint8), torch.zeros(2, 0)),
        (torch.zeros(5, 24, 16, 3, dtype=torch.uint8), torch.zeros(2, 801)),
    ],
)
def test_bad_media_get_our_encoders_errors(official, vaes, frames, audio):
    hook_video, hook_audio = load_vaes(official, trust_remote_code=True)
    for ours, hook, media in ((vaes[0], hook_video, frames), (vaes[1], hook_audio, audio)):
        with pytest.raises(ValueError) as expected:
            ours.encode(media)
        with pytest.raises(ValueError, match=f"^{re.escape(str(expected.value))}$"):
            hook.encode(media)


def test_an_encode_output_of_the_wrong_shape_or_not_finite_is_refused(tmp_path, official):
    hook_video, hook_audio = load_vaes(copy_with(tmp_path, official, "HalfVideo", "NanAudio"), trust_remote_code=True)
    message = (
        f"{tmp_path / 'video_vae'}: encode returned shape [1, 12, 7, 2, 3]; expected a tensor (or .sample) of "
        "shape [1, 24, 7, 2, 3]"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hook_video.encode(torch.zeros(22, 32, 48, 3, dtype=torch.uint8))
    for method, argument in (("encode", torch.zeros(2, 1600)), ("decode", torch.zeros(2, 32, 2))):
        message = f"{tmp_path / 'audio_vae'}: {method} returned values that are not finite (NaN or infinity)"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            getattr(hook_audio, method)(argument)


@pytest.mark.parametrize(
    "video, audio",
    [
        (torch.zeros(24, 2, 1, 1, dtype=torch.float64), torch.zeros(2, 32, 1, dtype=torch.float64)),
        (torch.zeros(23, 2, 1, 1), torch.zeros(1, 32, 1)),
        (torch.zeros(24, 3, 1, 1), torch.zeros(2, 32, 0)),
        (torch.zeros(24, 2, 0, 1), torch.zeros(2, 31, 4)),
    ],
)
def test_bad_latents_get_our_vaes_errors(official, vaes, video, audio):
    hook_video, hook_audio = load_vaes(official, trust_remote_code=True)
    for ours, hook, latent in ((vaes[0], hook_video, video), (vaes[1], hook_audio, audio)):
        with pytest.raises(ValueError) as expected:
            ours.decode(latent)
        with pytest.raises(ValueError, match=f"^{re.escape(str(expected.value))}$"):
            hook.decode(latent)


def test_a_sample_object_and_a_flat_waveform_are_accepted(tmp_path, official, vaes):
    hook_video, hook_audio = load_vaes(
        copy_with(tmp_path, official, "SampleVideo", "FlatAudio"), trust_remote_code=True
    )
    video, audio = torch.randn(24, 7, 2, 3), torch.randn(2, 32, 5)
    assert torch.equal(hook_video.decode(video), vaes[0].decode(video))
    assert torch.equal(hook_audio.decode(audio), vaes[1].decode(audio))


def test_a_hook_output_of_the_wrong_shape_is_refused_naming_folder_and_shape(tmp_path, official):
    hook_video, hook_audio = load_vaes(copy_with(tmp_path, official, "ShortVideo", "ListAudio"), trust_remote_code=True)
    message = (
        f"{tmp_path / 'video_vae'}: decode returned shape [1, 3, 5, 32, 48]; expected a tensor (or .sample) of "
        "shape [1, 3, 22, 32, 48]"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hook_video.decode(torch.zeros(24, 7, 2, 3))
    message = (
        f"{tmp_path / 'audio_vae'}: decode returned list; expected a tensor (or .sample) of shape [2, 1, 4000] "
        "or [2, 4000]"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hook_audio.decode(torch.zeros(2, 32, 5))


def test_a_class_that_is_missing_or_gives_no_module_is_refused(tmp_path, official):
    folder = copy_with(tmp_path, official, "NotAModule")
    message = f"{folder / 'video_vae'}: NotAModule.from_pretrained returned NotAModule, not a torch.nn.Module"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_vaes(folder, trust_remote_code=True)
    edit_config(folder / "video_vae", lambda c: c["auto_map"].update(AutoModel="custom_vae.Missing"))
    message = f"{folder / 'video_vae' / 'custom_vae.py'} defines no class 'Missing' with from_pretrained"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_vaes(folder, trust_remote_code=True)


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_a_broken_contract_is_refused_before_the_opt_in_is_asked(tmp_path, official, trust_remote_code):
    folder = copy_with(tmp_path, official)
    video = folder / "video_vae"
    config = video / "config.json"
    edit_config(video, lambda c: c.pop("auto_map"))
    message = (
        f'{config} needs "auto_map": {{"AutoModel": "<module file stem>.<ClassName>"}} naming the VAE class, '
        "got auto_map None"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        load_vaes(folder, trust_remote_code=trust_remote_code)
    edit_config(video, lambda c: c.update(auto_map={"AutoModel": "absent.H3VideoVAE"}))
    message = f"{video / 'absent.py'} not found; {config} names it in auto_map.AutoModel 'absent.H3VideoVAE'"
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        load_vaes(folder, trust_remote_code=trust_remote_code)
    edit_config(video, lambda c: c.update(auto_map={"AutoModel": "modeling_h3_vae.H3VideoVAE"}))
    edit_config(folder / "audio_vae", lambda c: c.update(latents_std=c["latents_std"][:24]))
    message = f"{folder / 'audio_vae' / 'config.json'} latents_std must be a list of 32 numbers, got "
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        load_vaes(folder, trust_remote_code=trust_remote_code)
    shutil.rmtree(folder / "audio_vae")
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(str(folder / 'audio_vae' / 'config.json'))} not found$"):
        load_vaes(folder, trust_remote_code=trust_remote_code)


def test_an_engine_on_an_official_checkpoint_generates_what_the_native_one_does(tmp_path, vaes):
    dit = H3DiT(get_config("tiny"))
    init_weights(dit, 4)
    official, native = tmp_path / "official", tmp_path / "native"
    save_official_transformer(dit, official, 1_000_000)
    write_official_vaes(official, *vaes)
    for module, name in zip((dit, *vaes), ("dit", "video_vae", "audio_vae"), strict=True):
        save_weights(module, native / f"{name}.safetensors")
    with pytest.raises(ValueError, match=f"^{re.escape(REFUSAL.format(official / 'video_vae'))}$"):
        load_engine("tiny", official, with_encoder=False)
    request = GenerationRequest("a red ball", 32, 64, 22, 2, seed=5)
    text = torch.randn(3, 384, generator=torch.Generator().manual_seed(0))
    [(_, frames, audio)] = load_engine("tiny", official, with_encoder=False, trust_remote_code=True).generate(
        request, text
    )
    [(_, native_frames, native_audio)] = load_engine("tiny", native, with_encoder=False).generate(request, text)
    assert frames.shape == (22, 32, 64, 3) and torch.equal(frames, native_frames)
    assert audio.shape == (2, 29333) and torch.equal(audio, native_audio)


def test_the_writer_accepts_an_official_checkpoint_only_with_the_opt_in(tmp_path, capsys, vaes):
    dit = H3DiT(get_config("tiny"))
    save_official_transformer(dit, tmp_path / "official", 1 << 30)
    write_official_vaes(tmp_path / "official", *vaes)
    write_random_qwen3vl(tmp_path / "official" / "text_encoder", tiny_qwen3vl(384, 1))  # the writer checks its width
    write_byte_tokenizer(tmp_path / "official" / "tokenizer")
    argv = [str(tmp_path / "repo"), "--checkpoint", str(tmp_path / "official"), "--unsized"]
    assert R.main(argv) == 2
    refusal = REFUSAL.format(tmp_path / "official" / "video_vae")
    assert capsys.readouterr().err == f"python -m server.repository: {refusal}\n"
    assert R.main([*argv, "--config", "small", "--set", "h3_vae.trust_remote_code=true"]) == 2
    config = tmp_path / "official" / "transformer" / "config.json"
    mismatch = (
        f"{config} has num_layers=2 but the small config has num_layers=6 (it is the tiny config's: --config tiny)"
    )
    assert capsys.readouterr().err == f"python -m server.repository: {mismatch}\n"
    assert R.main([*argv, "--set", "h3_vae.trust_remote_code=true"]) == 0
    config.unlink()
    assert R.main([*argv, "--set", "h3_vae.trust_remote_code=true"]) == 2
    assert capsys.readouterr().err.endswith(f"python -m server.repository: {config} not found\n")
