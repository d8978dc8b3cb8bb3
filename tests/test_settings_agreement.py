"""The settings several models carry (h3_core.serving.shared.settings.SHARED_SETTINGS) agree:
each model refuses to load when a sibling's config.pbtxt in its repository holds another value
(h3_core.serving.shared.agreement), whatever order Triton loads them in, and the writer
(server.planner) keeps them equal and refuses given values that differ (issue 46 item 4)."""

import subprocess
import sys
from pathlib import Path

import pytest

from h3_core.serving.shared.agreement import check_agreement, check_siblings, sibling_parameters
from h3_core.serving.shared.settings import SHARED_SETTINGS, DitSettings, EncoderSettings, VaeSettings
from h3_core.serving.shared.triton import config_parameters
from server.environment import LaunchError
from server.process import TritonServer
from server.repository import plan, write_repository
from server.sizing import Machine

ENCODER, DIT, VAE = EncoderSettings.MODEL, DitSettings.MODEL, VaeSettings.MODEL
NAMES = {"encoder": EncoderSettings, "dit": DitSettings, "vae": VaeSettings}  # Repository's fields
GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]
CANVAS = "h3_dit, h3_encoder, h3_vae must carry the same max_height (h3_core.serving.shared.settings.SHARED_SETTINGS)"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The CPU repository as server.repository writes it (every model's defaults)."""
    return write_repository(tmp_path_factory.mktemp("agreement") / "repo", plan())


def hand_edit(repo, model: str, key: str, value: str) -> None:
    """Set `key` of `model`'s config.pbtxt to `value`, as an operator editing the file would."""
    config = repo / model / "config.pbtxt"
    before = config_parameters(config)[key]
    line = f'{{ key: "{key}" value: {{ string_value: "{before}" }} }}'
    assert config.read_text().count(line) == 1
    config.write_text(config.read_text().replace(line, line.replace(f'"{before}"', f'"{value}"')))


def test_the_table_names_only_keys_each_model_carries():
    fields = {cls.MODEL: set(cls().to_parameters()) for cls in (EncoderSettings, DitSettings, VaeSettings)}
    assert list(SHARED_SETTINGS) == [
        "config_name",
        "max_height",
        "max_width",
        "max_num_frames",
        "max_batch_rows",
        "max_request_mb",
        "tasks",
        "heartbeat_s",
        "checkpoint_dir",
        "trust_remote_code",
    ]
    for key, models in SHARED_SETTINGS.items():
        assert len(models) >= 2 and all(key in fields[model] for model in models), key


def test_a_hand_edited_pair_is_refused_by_both_models_naming_key_values_and_models(written, tmp_path):
    repo = write_repository(tmp_path / "repo", plan())
    hand_edit(repo, ENCODER, "max_height", "512")
    encoder, dit = config_parameters(repo / ENCODER / "config.pbtxt"), config_parameters(repo / DIT / "config.pbtxt")
    assert sibling_parameters(repo / DIT, DIT) == {
        ENCODER: encoder,
        VAE: config_parameters(repo / VAE / "config.pbtxt"),
    }
    # h3_encoder loads first, or h3_dit does: each refuses, naming itself first
    with pytest.raises(ValueError) as encoder_first:
        check_siblings(repo / ENCODER, ENCODER, encoder)
    assert (
        str(encoder_first.value)
        == f"h3_encoder parameter max_height='512' differs from h3_dit parameter max_height='256': {CANVAS}"
    )
    with pytest.raises(ValueError) as dit_first:
        check_siblings(repo / DIT, DIT, dit)
    assert (
        str(dit_first.value)
        == f"h3_dit parameter max_height='256' differs from h3_encoder parameter max_height='512': {CANVAS}"
    )
    # h3_vae carries max_height too, and agrees with h3_dit: its disagreement is with h3_encoder
    with pytest.raises(
        ValueError, match=r"^h3_vae parameter max_height='256' differs from h3_encoder parameter max_height='512'"
    ):
        check_siblings(repo / VAE, VAE, config_parameters(repo / VAE / "config.pbtxt"))
    # the written repository agrees everywhere
    for model in (ENCODER, DIT, VAE):
        check_siblings(written / model, model, config_parameters(written / model / "config.pbtxt"))


def test_values_compare_typed_and_an_absent_sibling_or_key_is_skipped(tmp_path):
    dit, vae = DitSettings().to_parameters(), VaeSettings().to_parameters()
    check_agreement(VAE, {**vae, "heartbeat_s": "15"}, {DIT: {**dit, "heartbeat_s": "15.0"}})
    check_agreement(VAE, vae, {DIT: {key: value for key, value in dit.items() if key != "heartbeat_s"}})
    with pytest.raises(ValueError) as refused:
        check_agreement(
            VAE,
            {**vae, "heartbeat_s": "15"},
            {ENCODER: EncoderSettings().to_parameters(), DIT: {**dit, "heartbeat_s": "0.5"}},
        )
    assert str(refused.value) == (
        "h3_vae parameter heartbeat_s='15' differs from h3_dit parameter heartbeat_s='0.5': h3_dit, h3_vae must "
        "carry the same heartbeat_s (h3_core.serving.shared.settings.SHARED_SETTINGS)"
    )
    repo = write_repository(tmp_path / "repo", plan())
    (repo / VAE / "config.pbtxt").unlink()  # a repository without h3_vae
    assert sorted(sibling_parameters(repo / DIT, DIT)) == [ENCODER]
    assert sibling_parameters(repo / ENCODER, ENCODER) == {DIT: config_parameters(repo / DIT / "config.pbtxt")}


def test_the_writer_keeps_shared_settings_equal_and_refuses_given_values_that_differ():
    for given in ({DIT: {"max_height": 128}}, {VAE: {"max_height": 128}}, {ENCODER: {"max_height": 128}}):
        repository = plan(overrides=given)
        assert (repository.encoder.max_height, repository.dit.max_height, repository.vae.max_height) == (128, 128, 128)
    repository = plan(overrides={DIT: {"heartbeat_s": 0.5}, VAE: {"heartbeat_s": "0.5"}})
    assert (repository.dit.heartbeat_s, repository.vae.heartbeat_s) == (0.5, 0.5)
    assert plan(overrides={VAE: {"trust_remote_code": True}}).encoder.trust_remote_code is True
    with pytest.raises(ValueError) as refused:
        plan(overrides={DIT: {"max_height": 128}, VAE: {"max_height": 64}})
    assert (
        str(refused.value)
        == f"h3_dit parameter max_height='128' differs from h3_vae parameter max_height='64': {CANVAS}"
    )


def test_a_hand_edited_canvas_fails_the_servers_load_with_both_models_messages(tmp_path):
    """End to end: a written repository whose h3_encoder max_height was edited by hand; Triton
    loads the models in parallel, h3_encoder and h3_dit each refuse (each checks its siblings),
    and the launcher's error carries the server log's messages. Fails before any weights load."""
    repo = write_repository(tmp_path / "repo", plan())
    hand_edit(repo, ENCODER, "max_height", "512")
    with pytest.raises(LaunchError) as failed:
        TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log").start()
    log = (tmp_path / "server.log").read_text()
    encoder = f"h3_encoder parameter max_height='512' differs from h3_dit parameter max_height='256': {CANVAS}"
    dit = f"h3_dit parameter max_height='256' differs from h3_encoder parameter max_height='512': {CANVAS}"
    assert encoder in log and dit in log
    assert encoder in str(failed.value) or dit in str(failed.value)


def test_the_writer_gives_h3_encoder_the_rows_and_request_memory_it_sized_for_h3_dit():
    """On cuda the writer sizes h3_dit's max_batch_rows and max_request_mb from the GPUs after the
    shared settings were copied: h3_encoder kept the CPU defaults (4,096 rows, 2,048 MiB) and let
    through requests h3_dit refuses (and refused ones it admits). Now it carries the sized values."""
    machine = Machine(16, {0: 42 * GIB, 1: 42 * GIB})
    wide = {ENCODER: {"encoder_path": "/encoder-5120"}}  # bench reads 5120-wide text states
    repository = plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=wide, placement="shared")
    encoder, dit = repository.encoder, repository.dit
    assert (
        (encoder.max_batch_rows, encoder.max_request_mb) == (dit.max_batch_rows, dit.max_request_mb) == (3_392, 16_074)
    )
    parameters = {cls.MODEL: getattr(repository, name).to_parameters() for name, cls in NAMES.items()}
    for model in parameters:
        check_agreement(model, parameters[model], parameters)


def test_config_parameters_reads_what_protobuf_reads_without_tritonclient(tmp_path):
    """config_parameters runs in the stub's Python, which need not hold tritonclient (a GPU host's
    did not): it reads the parameters as Triton's ModelConfig does (protobuf, the oracle here) for
    every shipped config.pbtxt and for a hand-written one with the list syntax, comments (one
    naming a string_value), escapes and a non-ASCII value; it imports no tritonclient."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    def by_protobuf(path):
        config = model_config_pb2.ModelConfig()
        text_format.Parse(path.read_text(), config)
        return {key: value.string_value for key, value in config.parameters.items()}

    hand = tmp_path / "config.pbtxt"
    hand.write_text(
        'name: "h3_dit"\nbackend: "python"\n# parameters { key: "x" value { string_value: "commented out" } }\n'
        'parameters [ { key: "max_height" value { string_value: "256" } },\n'
        '  { key: "prompt" value: { string_value: "a \\"quoted\\" caf\\303\\251 # not a comment" } } ]\n'
        'parameters: { key: "max_width", value: { string_value: "" } }\n'
    )
    assert (
        config_parameters(hand)
        == by_protobuf(hand)
        == {
            "max_height": "256",
            "prompt": 'a "quoted" café # not a comment',
            "max_width": "",
        }
    )
    for path in sorted((ROOT / "model_repository").glob("*/config.pbtxt")):
        assert config_parameters(path) == by_protobuf(path), path
    hand.write_text('parameters { key: "k" value { string_value: "a" "b" } }\n')  # adjacent strings: refused
    with pytest.raises(ValueError, match=r"cannot read its parameters: 1 string_value fields, 0 of them as"):
        config_parameters(hand)
    code = "import sys; from h3_core.serving.shared import agreement, triton; print('tritonclient' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout == "False\n"
