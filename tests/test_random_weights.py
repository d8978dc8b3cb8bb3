import re

import pytest
import torch

from h3_core.config import get_config
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.initialization import init_weights
from h3_core.model.vae import create_vaes
from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings
from h3_core.weights.checkpoint import load_dit, source_seed
from h3_core.weights.checkpoint_setup import create_checkpoint
from h3_core.weights.vae_hook import load_vaes
from server import repository as R

from .test_repository import parameters

BAD_SEED = (
    "weight source {!r} is not random:SEED with SEED an integer in 0..9223372036854775806 (e.g. random:0), "
    "nor a checkpoint folder"
)


def assert_same_weights(a, b):
    assert list(a) == list(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_random_0_is_what_checkpoint_setup_writes(tmp_path):
    assert create_checkpoint("tiny", tmp_path / "tiny", device="cpu")
    stored = load_engine("tiny", tmp_path / "tiny", with_encoder=False)
    drawn = load_engine("tiny", "random:0", with_encoder=False)
    assert_same_weights(drawn.dit.state_dict(), stored.dit.state_dict())
    assert_same_weights(drawn.video_vae.state_dict(), stored.video_vae.state_dict())
    assert_same_weights(drawn.audio_vae.state_dict(), stored.audio_vae.state_dict())


def test_random_seed_draws_the_dit_from_seed_and_the_vaes_from_seed_plus_one():
    dit, expected = H3DiT(get_config("tiny")), H3DiT(get_config("tiny"))
    load_dit(dit, "random:7")
    init_weights(expected, 7)
    assert_same_weights(dit.state_dict(), expected.state_dict())
    other = H3DiT(get_config("tiny"))
    load_dit(other, "random:8")
    assert not torch.equal(other.blocks[0].attn.qkv_proj.weight, dit.blocks[0].attn.qkv_proj.weight)
    video_vae, audio_vae = load_vaes("random:7")
    video_expected, audio_expected = create_vaes(8)
    assert_same_weights(video_vae.state_dict(), video_expected.state_dict())
    assert_same_weights(audio_vae.state_dict(), audio_expected.state_dict())
    assert not (video_vae.training or audio_vae.training)


def test_source_seed_reads_random_seed_and_leaves_folders():
    assert source_seed("random:0") == 0 and source_seed("random:0042") == 42
    assert source_seed("random:9223372036854775806") == 2**63 - 2
    assert source_seed("checkpoints/tiny") is None and source_seed(R.ROOT / "random:1") is None


@pytest.mark.parametrize(
    "source", ["random:x", "random:-1", "random:", "random:1.5", "random: 1", "random:9223372036854775807"]
)
def test_a_bad_random_source_is_refused_naming_the_allowed_form(source):
    message = f"^{re.escape(BAD_SEED.format(source))}$"
    with pytest.raises(ValueError, match=message):
        load_dit(H3DiT(get_config("tiny"), device="meta"), source)
    with pytest.raises(ValueError, match=message):
        load_vaes(source)
    with pytest.raises(ValueError, match=message):
        R.checkpoint_for(source, R.SHIPPED)


def test_the_writer_keeps_random_seed_as_given(tmp_path, capsys):
    assert R.checkpoint_for("random:7", R.SHIPPED) == "random:7"
    assert R.checkpoint_for("random:7", tmp_path / "repo") == "random:7"
    target = tmp_path / "repo"
    assert R.main([str(target), "--checkpoint", "random:3", "--unsized"]) == 0
    assert capsys.readouterr().out.startswith(
        f"model repository {target}: config tiny, checkpoint random:3, device cpu\n"
    )
    for model in ("h3_dit", "h3_vae"):
        assert parameters((target / model / "config.pbtxt").read_text())["checkpoint_dir"] == "random:3"


def test_the_writer_refuses_a_bad_random_source_with_one_line(tmp_path, capsys):
    assert R.main([str(tmp_path / "repo"), "--checkpoint", "random:x", "--unsized"]) == 2
    assert capsys.readouterr().err == f"python -m server.repository: {BAD_SEED.format('random:x')}\n"
    assert not (tmp_path / "repo").exists()


NO_ENCODER = EncoderSettings()  # the default MiniLM: no folder to check


def test_check_checkpoint_names_the_first_missing_native_file_of_each_source(tmp_path):
    create_checkpoint("tiny", tmp_path / "tiny")
    R.check_checkpoint(DitSettings(checkpoint_dir="random:0"), VaeSettings(checkpoint_dir="random:0"), NO_ENCODER)
    R.check_checkpoint(
        DitSettings(checkpoint_dir=str(tmp_path / "tiny")), VaeSettings(checkpoint_dir="random:0"), NO_ENCODER
    )
    (tmp_path / "tiny" / "audio_vae.safetensors").unlink()
    R.check_checkpoint(
        DitSettings(checkpoint_dir=str(tmp_path / "tiny")), VaeSettings(checkpoint_dir="random:0"), NO_ENCODER
    )
    message = (
        f"{tmp_path / 'tiny' / 'audio_vae.safetensors'} not found; seeded random weights: "
        f"python -m h3_core.weights.checkpoint_setup --configs tiny --root {tmp_path}"
    )
    with pytest.raises(FileNotFoundError, match=f"^{re.escape(message)}$"):
        R.check_checkpoint(
            DitSettings(checkpoint_dir="random:0"), VaeSettings(checkpoint_dir=str(tmp_path / "tiny")), NO_ENCODER
        )
