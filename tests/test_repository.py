"""server.repository, the one model-repository writer: the shipped model_repository/ is its output
for the defaults, the generated config texts (instance groups, max_batch_size, idle timeout, every
parameter), validated overrides, GPU sizing through plan(), the folders it writes and its CLI."""

import os
import re
import subprocess
import sys

import pytest

from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings
from server import launch
from server import repository as R
from server.sizing import GPU_EXECUTE_BUDGET_S, Machine, idle_timeout

from .serving import model_repository_copy

GIB = 2**30
WIDE = {"h3_encoder": {"encoder_path": "/encoder-5120"}}  # bench and h3 read 5120-wide text states
PARAMETER = re.compile(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}')


def parameters(text: str) -> dict[str, str]:
    return dict(PARAMETER.findall(text))


def line(text: str, start: str) -> str:
    """The one line of `text` that starts with `start`."""
    found = [row for row in text.splitlines() if row.startswith(start)]
    assert len(found) == 1, (start, found)
    return found[0]


def test_the_shipped_repository_is_the_writers_output_for_the_defaults():
    texts = R.config_texts(R.plan())
    assert sorted(texts) == sorted(path.parent.name for path in R.SHIPPED.glob("*/config.pbtxt"))
    for model, text in texts.items():
        assert (R.SHIPPED / model / "config.pbtxt").read_text() == text, model
    # and the CPU sizing of a 2-core machine changes nothing: 2 cores / 3 processes -> 1 thread
    assert R.config_texts(R.plan(machine=Machine(2, {}))) == texts


def test_every_parameter_of_every_model_is_written():
    repository = R.plan("demo", "/w", overrides={"h3_dit": {"max_steps": 7}})
    texts = R.config_texts(repository)
    for settings in (repository.encoder, repository.dit, repository.vae):
        assert parameters(texts[settings.MODEL]) == settings.to_parameters()
    assert parameters(texts["h3_dit"])["max_steps"] == "7"
    assert (parameters(texts["h3_dit"])["config_name"], parameters(texts["h3_dit"])["checkpoint_dir"]) == ("demo", "/w")
    assert parameters(texts["h3_vae"])["checkpoint_dir"] == "/w"
    assert DitSettings.from_parameters(parameters(texts["h3_dit"]), 14) == repository.dit


def test_instance_groups_for_two_cpu_dit_instances():
    texts = R.config_texts(R.plan(dit_instances=2))
    assert line(texts["h3_dit"], "instance_group") == "instance_group [ { kind: KIND_CPU count: 2 } ]"
    assert line(texts["h3_encoder"], "instance_group") == "instance_group [ { kind: KIND_CPU count: 1 } ]"
    assert line(texts["h3_vae"], "instance_group") == "instance_group [ { kind: KIND_CPU count: 1 } ]"


def test_instance_groups_for_gpus_0_and_1():
    repository = R.plan("bench", "/w", "cuda", [0, 1], overrides=WIDE)
    texts = R.config_texts(repository)
    assert line(texts["h3_dit"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0, 1 ] } ]"
    assert line(texts["h3_encoder"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
    assert line(texts["h3_vae"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
    assert (repository.dit.device, repository.vae.device) == ("cuda", "cuda:0")
    assert R.plan("bench", "/w", "cuda", [1, 0], overrides=WIDE).vae.device == "cuda:1"
    assert sum(group.instances for group in repository.groups.values()) == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(device="cuda"), "--device cuda needs at least one GPU"),
        (dict(device="cuda", gpus=[0], dit_instances=2), "dit_instances=2: on cuda h3_dit has one instance per GPU"),
        (dict(gpus=[0]), "GPUs were given for --device cpu; use --device cuda"),
        (dict(dit_instances=0), "dit_instances=0 is out of range: allowed >= 1"),
        (dict(device="tpu"), r"device 'tpu' is not one of \('cpu', 'cuda'\)"),
        (dict(config="huge"), "config 'huge' is unknown"),
    ],
)
def test_bad_placements_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        R.plan(**kwargs)


def test_max_batch_size_is_the_sequence_slots():
    text = R.config_texts(R.plan(overrides={"h3_dit": {"max_num_seqs": "6", "max_waiting": "3"}}))["h3_dit"]
    assert line(text, "max_batch_size") == "max_batch_size: 11"
    assert "max_num_seqs + max_waiting + 2 control slots (6 + 3 + 2)" in text
    assert line(R.config_texts(R.plan())["h3_encoder"], "max_batch_size") == "max_batch_size: 1"


def test_the_idle_timeout_is_sized_and_can_be_given():
    def idle(repository):
        return line(R.config_texts(repository)["h3_dit"], "  max_sequence_idle_microseconds")

    assert idle(R.plan()) == "  max_sequence_idle_microseconds: 60000000"
    request = {"execution_mode": "request", "scheduling_policy": "request", "max_batch_rows": "65536"}
    # 50 steps x (0.355 s x 65,536 / 16,384 rows x 50 / 8 layers) x 1.5, x 2.8 with GPU turns (one
    # GPU: h3_vae shares it)
    assert idle(R.plan("h3", "/w", "cuda", [0], overrides={"h3_dit": request, **WIDE})) == (
        "  max_sequence_idle_microseconds: 1863750000"
    )
    assert idle(R.plan("h3", "/w", "cuda", [0], overrides={"h3_dit": request, **WIDE}, placement="cpu")) == (
        "  max_sequence_idle_microseconds: 665625000"
    )
    assert idle(R.plan(idle_timeout_s=1)) == "  max_sequence_idle_microseconds: 1000000"
    assert R.plan(idle_timeout_s=1).idle_reason == "1 s, given."
    with pytest.raises(ValueError) as error:  # an execute may last its budget and one step more
        R.plan(idle_timeout_s=0.05)
    assert str(error.value) == (
        "h3_dit parameter execute_budget_s=0.03 must be below half of max_sequence_idle_microseconds (0.05 s): "
        "an execute() that outlasts it loses every live request"
    )


def test_overrides_are_validated_by_the_settings():
    with pytest.raises(ValueError, match=r"h3_dit parameters: unknown \['colour'\], missing \[\]; expected exactly"):
        R.plan(overrides={"h3_dit": {"colour": "red"}})
    with pytest.raises(ValueError, match=r"h3_vae parameters: unknown \['max_waiting'\]"):
        R.plan(overrides={"h3_vae": {"max_waiting": 2}})
    with pytest.raises(ValueError, match="h3_dit parameter max_waiting='eight' is not a valid int"):
        R.plan(overrides={"h3_dit": {"max_waiting": "eight"}})
    with pytest.raises(ValueError, match=r"no model 'h3_nowhere' to set: choose one of \['h3_dit', 'h3_encoder', "):
        R.plan(overrides={"h3_nowhere": {"max_steps": 7}})
    with pytest.raises(ValueError, match="h3_vae parameter decode_workers=0 is out of range"):
        R.plan(overrides={"h3_vae": {"decode_workers": 0}})
    smaller = R.plan(overrides={"h3_dit": {"max_batch_rows": 2048}}).dit  # row_budget follows unless given
    assert (smaller.max_batch_rows, smaller.row_budget) == (2048, 2048)
    with pytest.raises(ValueError, match=r"row_budget=3000 is out of range: allowed 1..2048 \(max_batch_rows\)"):
        R.plan(overrides={"h3_dit": {"max_batch_rows": 2048, "row_budget": 3000}})
    repository = R.plan(overrides={"h3_dit": {"allow_fault_injection": True}, "h3_encoder": {"max_tokens": 64}})
    assert (repository.dit.allow_fault_injection, repository.encoder.max_tokens) == (True, 64)
    assert repository.notes == ("h3_encoder.max_tokens 64: given", "h3_dit.allow_fault_injection true: given")


def test_gpu_sizing_golden_numbers():
    machine = Machine(16, {0: 42 * GIB, 1: 42 * GIB})
    repository = R.plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=WIDE, placement="shared")
    dit = repository.dit
    # GPU 0 holds h3_vae and h3_encoder (whose folder /encoder-5120 holds no weights): (42 GiB -
    # 12,052,395,520 B weights - 64 x 1,569,792 B AdaLN table - 2 x 14,402 MiB decodes - 4,096 x 67 x
    # 5376 B of CUDA graph pool) / (67 x 5376 B + (4 + 8) held requests x 768 B of step cache) = 3,426.5
    # -> 3,392 rows;
    # GPU 1 only its DiT instance: 65,536 rows, its own packs
    assert (dit.max_batch_rows, dit.row_budget, dit.max_batch_rows_by_gpu) == (3_392, 3_392, "0:3392,1:65536")
    assert (dit.for_gpu(0).max_batch_rows, dit.for_gpu(1).max_batch_rows) == (3_392, 65_536)
    # request_memory_mb(672, 672, 209, 3392, 5376, step_cache=True): 96 x 3392 x 5376 + 160 x 672 x 672 x 209
    # + 768 x 3392 B -> 16,074 MiB
    assert dit.max_request_mb == 16_074
    assert (dit.max_height, dit.max_width, dit.max_num_frames) == (672, 672, 209)  # bench's 672 x 384, 209 frames
    assert (repository.encoder.cpu_threads, dit.cpu_threads, repository.vae.cpu_threads) == (4, 4, 4)  # 16 / 4
    assert repository.idle_microseconds == 60_000_000
    assert (
        "GPU 0: 43,008 MiB free - 11,589 MiB DiT weights (quantization none, AdaLN table of 64 values) - "
        "28,804 MiB decode reserve (2 decode workers x a 672 x 672 px, 209-frame decode) - 0 MiB text encoder "
        "weights (none found in /encoder-5120) - "
        "1,407 MiB CUDA graph pool (4,096 graphed rows) -> 3,392 rows at 67 bytes per row and unit of hidden_size "
        "5376 (measured on an H200 in bf16, server.sizing) + 9,216 bytes per row of 12 held requests' step caches"
        in repository.notes
    )
    assert (
        "GPU 1: 43,008 MiB free - 11,589 MiB DiT weights (quantization none, AdaLN table of 64 values) - "
        "1,407 MiB CUDA graph pool (4,096 graphed rows) -> 65,536 rows at 67 bytes per row and unit of "
        "hidden_size 5376 (measured on an H200 in bf16, "
        "server.sizing) + 9,216 bytes per row of 12 held requests' step caches" in repository.notes
    )
    # explicit settings win over sizing
    given = R.plan(
        "bench",
        "/w",
        "cuda",
        [0, 1],
        machine=machine,
        overrides={"h3_dit": {"max_batch_rows": 1024, "cpu_threads": 2, "max_height": 384}, **WIDE},
        placement="shared",
    )
    assert (given.dit.max_batch_rows, given.dit.row_budget, given.dit.cpu_threads, given.dit.max_height) == (
        1024,
        1024,
        2,
        384,
    )
    # sized for the given 672 x 384 px canvas: a 2 x 8,230 MiB decode reserve, the AdaLN table and the graph
    # pool leave 14,209,387,008 B / (67 x 5376 + 12 x 768 B) = 38,465.2 -> 38,464 rows
    assert (
        "h3_dit.max_batch_rows 1024: given (sized it would be 38464: the largest request, which every h3_dit "
        "instance takes: the least over the instances' GPUs [0, 1], a multiple of 64, at most 65,536)" in given.notes
    )
    assert given.dit.max_batch_rows_by_gpu == ""  # a given max_batch_rows is every instance's
    with pytest.raises(ValueError, match="the DiT does not fit"):
        R.plan("h3", "/w", "cuda", [0], machine=Machine(16, {0: 40 * GIB}), overrides=WIDE)


def test_the_default_placement_is_the_one_with_more_instances_that_take_the_default_request():
    machine = Machine(16, {0: 42 * GIB, 1: 42 * GIB})
    chosen = R.plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=WIDE)
    # shared: GPU 0 keeps 3,392 rows, under bench's 16,384-row default request; own: GPU 1 holds
    # h3_encoder and h3_vae, GPU 0 one h3_dit instance of 65,536 rows
    assert chosen.notes[0] == (
        "placement own (chosen for 2 GPUs: the most h3_dit instances that each take a 16,384-row request of the "
        "default canvas (shared: 2 h3_dit instances, the largest request 3,392 rows, under a 16,384-row request; "
        "own: 1 h3_dit instances, the largest request 65,536 rows)): h3_encoder and h3_vae on a GPU of their own, "
        "the last; h3_dit on the others"
    )
    assert chosen == R.plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=WIDE, placement="own")
    texts = R.config_texts(chosen)
    assert line(texts["h3_dit"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
    assert line(texts["h3_vae"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 1 ] } ]"
    assert line(texts["h3_encoder"], "instance_group") == line(texts["h3_vae"], "instance_group")
    assert (chosen.dit.max_batch_rows, chosen.encoder.device, chosen.vae.device) == (65_536, "cuda:1", "cuda:1")
    # 43,008 MiB - 28,804 MiB of decodes - 0 MiB of text encoder weights
    assert any(note.startswith("GPU 1: 43,008 MiB free - 28,804 MiB decode reserve") for note in chosen.notes)
    assert any(note.endswith("-> 14,204 MiB left (no h3_dit)") for note in chosen.notes)
    # where both take the request the shared placement, with more instances, wins; one GPU is shared
    roomy = Machine(16, {0: 140 * GIB, 1: 140 * GIB})
    assert (
        R.plan("bench", "/w", "cuda", [0, 1], machine=roomy, overrides=WIDE)
        .notes[0]
        .startswith(
            "placement shared (chosen for 2 GPUs: the most h3_dit instances that each take a 16,384-row request of "
            "the default canvas (shared: 2 h3_dit instances, the largest request 65,536 rows; own: 1 h3_dit instances"
        )
    )
    single = R.plan("bench", "/w", "cuda", [0], machine=roomy, overrides=WIDE)
    assert single.notes[0] == (
        "placement shared (chosen for 1 GPU: one GPU): h3_encoder and h3_vae on the first GPU, beside its h3_dit "
        "instance"
    )
    # the text encoder's weights, when given, come off its GPU: 140 GiB - 98 GiB leaves the 42 GiB case above
    given = R.plan("bench", "/w", "cuda", [0], machine=roomy, overrides=WIDE, text_encoder_bytes=98 * GIB)
    assert given.dit.max_batch_rows == 3_392


def test_placement_cpu_and_sequence_parallel_groups_beside_own():
    cpu = R.plan("bench", "/w", "cuda", [0, 1], overrides=WIDE, placement="cpu")
    texts = R.config_texts(cpu)
    assert line(texts["h3_dit"], "instance_group") == "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0, 1 ] } ]"
    assert line(texts["h3_encoder"], "instance_group") == "instance_group [ { kind: KIND_CPU count: 1 } ]"
    assert line(texts["h3_vae"], "instance_group") == "instance_group [ { kind: KIND_CPU count: 1 } ]"
    assert (cpu.encoder.device, cpu.vae.device) == ("cpu", "cpu")
    own = R.plan("bench", "/w", "cuda", [0, 1, 2], overrides={"h3_dit": {"sp_degree": 2}, **WIDE}, placement="own")
    assert R.config_texts(own)["h3_dit"].count("gpus: [ 0 ]") == 1 and own.vae.device == "cuda:2"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(device="cuda", gpus=[0], placement="own"), r"--placement own needs at least 2 GPUs .*, got \[0\]"),
        (dict(placement="cpu"), "--placement cpu places h3_encoder and h3_vae beside GPUs: it needs --device cuda"),
        (
            dict(device="cuda", gpus=[0, 1], placement="gpu"),
            r"--placement 'gpu' is not one of \('shared', 'own', 'cpu'\)",
        ),
        (
            dict(device="cuda", gpus=[0, 1], placement="own", machine=Machine(2, {0: 40 * GIB, 1: 20 * GIB})),
            "h3_encoder and h3_vae do not fit GPU 1: 20,480 MiB free - 28,804 MiB decode reserve",
        ),
    ],
)
def test_bad_encoder_and_vae_placements_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        R.plan("bench", "/w", **{"overrides": WIDE, **kwargs})


def test_cuda_without_a_machine_keeps_the_rows_and_derives_the_rest():
    dit = R.plan("bench", "/w", "cuda", [0], overrides=WIDE).dit
    # request_memory_mb(672, 672, 209, 4096, 5376, step_cache=True): 96 x 4096 x 5376 + 15,100,968,960
    # + 768 x 4096 B -> 16,421 MiB
    assert (dit.max_batch_rows, dit.row_budget, dit.max_request_mb, dit.cpu_threads) == (4096, 4096, 16_421, 1)
    tiny = R.plan("tiny", "/w", "cuda", [0]).dit  # its own canvas is under the CPU limits: they stay
    assert (tiny.max_height, tiny.max_width, tiny.max_num_frames) == (256, 256, 124)


def test_gpu_repositories_take_steps_for_a_second_per_execute():
    # several steps per execute while nothing is announced for the DiT (server.sizing); the CPU
    # repository keeps the shipped 0.03 s; a given budget wins
    repository = R.plan("bench", "/w", "cuda", [0], overrides=WIDE)
    assert repository.dit.execute_budget_s == GPU_EXECUTE_BUDGET_S == 1.0
    assert any(note.startswith("h3_dit.execute_budget_s 1.0: ") for note in repository.notes)
    assert 'execute_budget_s" value: { string_value: "1.0" }' in R.config_texts(repository)["h3_dit"]
    assert R.plan().dit.execute_budget_s == 0.03
    given = R.plan("bench", "/w", "cuda", [0], overrides={"h3_dit": {"execute_budget_s": 0.2}, **WIDE})
    assert given.dit.execute_budget_s == 0.2


def test_the_text_encoder_must_give_the_configs_text_width(tmp_path):
    with pytest.raises(ValueError) as error:
        R.plan("bench", "/w", "cuda", [0])
    assert str(error.value) == (
        'config bench reads 5120-wide text states but the default text encoder (MiniLM-L6, encoder_path "") gives '
        "384: set h3_encoder.encoder_path to an encoder of width 5120 (python benchmarks/bench_text_encoder.py DIR "
        "--width 5120 writes a weight-free one)"
    )
    (tmp_path / "config.json").write_text('{"hidden_size": 1024}')
    with pytest.raises(ValueError, match=f"but the text encoder {tmp_path} gives 1024"):
        R.plan("h3", "/w", "cuda", [0], overrides={"h3_encoder": {"encoder_path": str(tmp_path)}})
    (tmp_path / "config.json").write_text('{"hidden_size": 5120}')
    assert R.plan("h3", "/w", "cuda", [0], overrides={"h3_encoder": {"encoder_path": str(tmp_path)}})
    assert R.plan("demo", "/w").encoder.encoder_path == ""  # MiniLM's 384 is demo's text_dim


def test_checkpoint_paths_are_relative_only_in_the_shipped_repository(tmp_path):
    assert R.checkpoint_for("checkpoints/tiny", R.SHIPPED) == "checkpoints/tiny"
    assert R.checkpoint_for(str(R.ROOT / "weights" / "demo"), R.SHIPPED) == "weights/demo"
    assert R.checkpoint_for("checkpoints/tiny", tmp_path / "repo") == str(R.ROOT / "checkpoints" / "tiny")
    assert R.checkpoint_for("/data/h3", R.SHIPPED) == "/data/h3"


def test_a_written_copy(tmp_path):
    repo = model_repository_copy(tmp_path / "repo", dit_instances=2, max_steps="7")
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()) == [
        "h3_cancel/1/model.py",
        "h3_cancel/config.pbtxt",
        "h3_dit/1/model.py",
        "h3_dit/config.pbtxt",
        "h3_encoder/1/model.py",
        "h3_encoder/config.pbtxt",
        "h3_pipeline/1/.gitkeep",
        "h3_pipeline/config.pbtxt",
        "h3_vae/1/model.py",
        "h3_vae/config.pbtxt",
    ]
    dit = (repo / "h3_dit" / "config.pbtxt").read_text()
    assert parameters(dit)["max_steps"] == "7"
    assert line(dit, "instance_group") == "instance_group [ { kind: KIND_CPU count: 2 } ]"
    for model in ("h3_dit", "h3_vae"):
        text = (repo / model / "config.pbtxt").read_text()
        assert parameters(text)["checkpoint_dir"] == str(R.ROOT / "checkpoints" / "tiny")
    assert (repo / "h3_dit" / "1" / "model.py").read_text() == (R.SHIPPED / "h3_dit" / "1" / "model.py").read_text()
    # an earlier repository is replaced; any other non-empty folder is not
    model_repository_copy(tmp_path / "repo", max_steps="9")
    assert parameters((repo / "h3_dit" / "config.pbtxt").read_text())["max_steps"] == "9"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not empty and holds no model repository; not replacing it"):
        model_repository_copy(tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_the_cli_writes_the_demo_repository_and_says_what_it_sized(tmp_path, capsys):
    target = tmp_path / "demo"
    assert (
        R.main(
            [
                str(target),
                "--config",
                "demo",
                "--checkpoint",
                str(R.DEMO_WEIGHTS),
                "--dit-instances",
                "2",
                "--set",
                "h3_dit.max_waiting=2",
                "--set",
                "h3_vae.decode_workers=1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    cores = len(os.sched_getaffinity(0))
    media = "reference media of the length of the demo model's clips (< 1 s)"
    assert out[:10] == [
        f"model repository {target}: config demo, checkpoint {R.DEMO_WEIGHTS}, device cpu",
        "  h3_encoder: instance_group [ { kind: KIND_CPU count: 1 } ]",
        "  h3_dit: instance_group [ { kind: KIND_CPU count: 2 } ]",
        "  h3_vae: instance_group [ { kind: KIND_CPU count: 1 } ]",
        "  h3_dit.max_batch_size 8: max_num_seqs 4 + max_waiting 2 + 2 control slots",
        f"  h3_encoder.min_audio_s 0.25: {media}",
        f"  h3_encoder.max_audio_s 2.0: {media}",
        f"  h3_encoder.max_total_audio_s 2.0: {media}",
        f"  h3_encoder.max_video_s 2.0: {media}",
        f"  h3_encoder.cpu_threads {max(1, cores // 4)}: {cores} cores / 4 model processes",
    ]
    assert "  h3_dit.max_waiting 2: given" in out and "  h3_vae.decode_workers 1: given" in out
    assert out[-1].startswith("  h3_dit.max_sequence_idle_microseconds 60000000: on the CPU 60 s")
    dit = parameters((target / "h3_dit" / "config.pbtxt").read_text())
    assert (dit["config_name"], dit["checkpoint_dir"], dit["max_waiting"]) == ("demo", str(R.DEMO_WEIGHTS), "2")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "h3_dit.colour=red"], "h3_dit parameters: unknown ['colour']"),
        (["--set", "max_waiting=2"], "--set 'max_waiting=2' is not MODEL.KEY=VALUE (e.g. h3_dit.max_waiting=2)"),
        (["--gpus", "0"], "--gpus needs --device cuda"),
        (
            ["--config", "demo"],
            f"checkpoint folder {R.ROOT / 'checkpoints' / 'demo'} does not exist; seeded random weights: python -m "
            "h3_core.weights.checkpoint_setup --configs demo --root ",
        ),
    ],
)
def test_the_cli_refuses_with_one_line(tmp_path, capsys, argv, message):
    assert R.main([str(tmp_path / "repo"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m server.repository: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "repo").exists()


def test_the_settings_dataclasses_are_the_models_written():
    assert R.SETTINGS == {"h3_encoder": EncoderSettings, "h3_dit": DitSettings, "h3_vae": VaeSettings}


def test_the_launcher_serves_what_the_writer_writes_from_the_same_options(tmp_path):
    """make serve-demo's path: server.launch with repository options runs the writer, then serves."""
    written = tmp_path / "written"
    check = (
        "import json, os, urllib.request; config = json.load(urllib.request.urlopen("
        "'http://' + os.environ['H3_HTTP_URL'] + '/v2/models/h3_dit/config')); "
        "assert config['parameters']['config_name']['string_value'] == 'demo', config; "
        "assert config['max_batch_size'] == 7, config; print('served', config['name'])"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "server.launch",
            "--free-ports",
            "--config",
            "demo",
            "--checkpoint",
            str(R.DEMO_WEIGHTS),
            "--set",
            "h3_dit.max_waiting=1",
            "--write-repository",
            str(written),
            "--then",
            sys.executable,
            "-c",
            check,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "served h3_dit" in done.stdout and "  h3_dit.max_waiting 1: given" in done.stdout
    assert parameters((written / "h3_dit" / "config.pbtxt").read_text())["max_waiting"] == "1"  # kept


def test_the_launcher_refuses_bad_repository_options_before_starting_a_server(capsys):
    assert launch.main(["--set", "h3_dit.colour=red", "--free-ports"]) == 2
    with pytest.raises(SystemExit) as error:
        launch.main(["--model-repository", str(R.SHIPPED), "--config", "demo"])
    assert error.value.code == 2
    assert "--model-repository serves a repository as it is" in capsys.readouterr().err


def test_gpu_turns_only_where_h3_vae_decodes_on_a_gpu_beside_h3_dit():
    machine = Machine(16, {0: 140 * GIB, 1: 140 * GIB})

    def turns(placement: str, **overrides) -> tuple[bool, bool]:
        repository = R.plan(
            "bench", "/w", "cuda", [0, 1], machine=machine, overrides={**WIDE, **overrides}, placement=placement
        )
        return repository.vae.gpu_turns, repository.dit.gpu_turns

    shared = R.plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=WIDE, placement="shared")
    assert (shared.vae.gpu_turns, shared.dit.gpu_turns, shared.vae.device) == (True, True, "cuda:0")
    assert [note.split(":")[0] for note in shared.notes if "gpu_turns" in note] == [
        "h3_vae.gpu_turns true",
        "h3_dit.gpu_turns true",
    ]
    # the idle timeout counts a step's wait for its turn (issue 43 item 1)
    rows = shared.dit.max_batch_rows
    assert shared.idle_microseconds == idle_timeout("cuda", "step", rows, 8, shared.dit.max_steps, gpu_turns=True)[0]
    assert "(GPU turns)" in shared.idle_reason
    assert turns("own") == (False, False)  # h3_vae on a GPU of its own
    assert turns("cpu") == (False, False)
    assert turns("shared", h3_vae={"device": "cpu"}) == (False, False)  # moved off the GPU by hand
    assert turns("shared", h3_dit={"sp_degree": 2}) == (False, False)  # a sequence-parallel group takes none


def test_drawn_encoder_weights_need_a_qwen3vl_folder():
    with pytest.raises(ValueError) as error:
        R.plan(overrides={"h3_encoder": {"encoder_weights": "random:0"}})
    assert str(error.value) == (
        "h3_encoder parameter encoder_weights='random:0' draws a Qwen3-VL's weights: encoder_path (the MiniLM "
        'default) is not a Qwen3-VL folder; leave encoder_weights "" to read the folder\'s weights'
    )
