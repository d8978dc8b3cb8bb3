"""h3_core.serving.shared.settings: each served model's settings from its config.pbtxt parameters."""

import re
from pathlib import Path

import pytest

from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings
from server.repository import plan

ROOT = Path(__file__).resolve().parents[1]
PARAMETER = re.compile(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}')


def shipped(model: str) -> tuple[dict[str, str], int]:
    """(parameters, max_batch_size) of model_repository/<model>/config.pbtxt."""
    text = (ROOT / "model_repository" / model / "config.pbtxt").read_text()
    return dict(PARAMETER.findall(text)), int(re.search(r"^max_batch_size: (\d+)$", text, re.MULTILINE)[1])


@pytest.mark.parametrize("cls", [DitSettings, EncoderSettings, VaeSettings])
def test_the_shipped_repository_holds_the_defaults(cls):
    parameters, max_batch_size = shipped(cls.MODEL)
    settings = (
        DitSettings.from_parameters(parameters, max_batch_size)
        if cls is DitSettings
        else cls.from_parameters(parameters)
    )
    assert settings == cls() and cls.from_parameters(cls().to_parameters()) == cls()


def test_the_dit_limits_are_the_request_limits():
    limits = DitSettings(max_height=128, max_batch_rows=2048, row_budget=1024).limits()
    assert (limits.max_height, limits.max_width, limits.max_rows, limits.max_request_mb) == (128, 256, 2048, 2048)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "h3_dit parameters: unknown ['colour'], missing []; expected exactly "),
        ({"max_waiting": None}, "h3_dit parameters: unknown [], missing ['max_waiting']; expected exactly "),
        ({"max_waiting": "eight"}, "h3_dit parameter max_waiting='eight' is not a valid int"),
        ({"allow_fault_injection": "yes"}, "h3_dit parameter allow_fault_injection='yes' is not 'true' or 'false'"),
        ({"execution_mode": "batch"}, "h3_dit parameter execution_mode='batch' is not one of ('step', 'request')"),
        ({"row_budget": "5000"}, "h3_dit parameter row_budget=5000 is out of range: allowed 1..4096 (max_batch_rows)"),
        ({"max_num_seqs": "0"}, "h3_dit parameter max_num_seqs=0 is out of range: allowed >= 1"),
        ({"max_wait_s": "0"}, "h3_dit parameter max_wait_s=0.0 is out of range: allowed finite > 0 seconds"),
        ({"max_wait_s": "inf"}, "h3_dit parameter max_wait_s=inf is out of range: allowed finite > 0 seconds"),
        ({"max_wait_s": "nan"}, "h3_dit parameter max_wait_s=nan is out of range: allowed finite > 0 seconds"),
        ({"max_wait_s": "soon"}, "h3_dit parameter max_wait_s='soon' is not a valid float"),
        ({"priority_max": "-1"}, "h3_dit parameter priority_max=-1 is out of range: allowed >= 0"),
        ({"priority_max": "1.5"}, "h3_dit parameter priority_max='1.5' is not a valid int"),
        ({"heartbeat_s": "0"}, "h3_dit parameter heartbeat_s=0.0 is out of range: allowed finite > 0 seconds"),
        ({"heartbeat_s": "inf"}, "h3_dit parameter heartbeat_s=inf is out of range: allowed finite > 0 seconds"),
        ({"execute_budget_s": "-0.5"}, "h3_dit parameter execute_budget_s=-0.5 is out of range: allowed finite >= 0"),
        ({"execute_budget_s": "nan"}, "h3_dit parameter execute_budget_s=nan is out of range: allowed finite >= 0"),
        (
            {"max_batch_rows_by_gpu": "0=8192"},
            "h3_dit parameter max_batch_rows_by_gpu='0=8192' is not comma-separated GPU:ROWS pairs, each GPU once",
        ),
        ({"max_batch_rows_by_gpu": "0:8192,0:9000"}, "h3_dit parameter max_batch_rows_by_gpu='0:8192,0:9000' is not"),
        (
            {"max_batch_rows_by_gpu": "0:8192,1:2048"},
            "h3_dit parameter max_batch_rows_by_gpu='0:8192,1:2048': GPU 1's 2048 rows are out of range: allowed >= "
            "max_batch_rows (4096), the largest request every instance takes",
        ),
        (
            {"max_num_seqs": "6"},
            "h3_dit max_batch_size=14 must equal max_num_seqs + max_waiting + 2 = 16 (its sequence slots)",
        ),
    ],
)
def test_bad_dit_parameters_are_refused_at_load(change, message):
    parameters, max_batch_size = shipped("h3_dit")
    for key, value in change.items():
        if value is None:
            del parameters[key]
        else:
            parameters[key] = value
    with pytest.raises(ValueError) as error:
        DitSettings.from_parameters(parameters, max_batch_size)
    assert str(error.value).startswith(message)


def test_each_gpu_instance_reads_its_own_rows():
    parameters, max_batch_size = shipped("h3_dit")
    settings = DitSettings.from_parameters({**parameters, "max_batch_rows_by_gpu": "0:7616,1:65536"}, max_batch_size)
    assert settings.rows_by_gpu() == {0: 7616, 1: 65536}
    on_1 = settings.for_gpu(1)
    assert (on_1.max_batch_rows, on_1.max_batch_rows_by_gpu, on_1.limits().max_rows, on_1.row_budget) == (
        65536,
        "",
        65536,
        4096,
    )
    assert settings.for_gpu(0).max_batch_rows == 7616
    assert settings.for_gpu(2) is settings  # an unlisted GPU keeps max_batch_rows
    assert DitSettings().rows_by_gpu() == {}


def test_the_longest_wait_and_the_priority_range_are_read_from_the_parameters():
    parameters, max_batch_size = shipped("h3_dit")
    assert (parameters["max_wait_s"], parameters["priority_max"]) == ("30.0", "100")
    settings = DitSettings.from_parameters({**parameters, "max_wait_s": "2.5", "priority_max": "0"}, max_batch_size)
    assert (settings.max_wait_s, settings.priority_max) == (2.5, 0)


def test_an_execute_budget_of_half_the_idle_timeout_or_more_is_refused_at_load():
    """An execute lasts its budget and at most one step more; Triton reaps every live request
    when one outlasts max_sequence_idle_microseconds (h3_dit passes it as idle_s)."""
    parameters, max_batch_size = shipped("h3_dit")
    assert DitSettings.from_parameters(parameters, max_batch_size, idle_s=60.0).execute_budget_s == 0.03
    with pytest.raises(ValueError) as error:
        DitSettings.from_parameters({**parameters, "execute_budget_s": "30"}, max_batch_size, idle_s=60.0)
    assert str(error.value) == (
        "h3_dit parameter execute_budget_s=30.0 must be below half of max_sequence_idle_microseconds (60 s): "
        "an execute() that outlasts it loses every live request"
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_request_mode_refuses_an_idle_timeout_below_its_longest_generation(device):
    """In execution mode "request" one execute runs a whole generation; Triton reaps every
    sequence waiting behind it when it lasts the idle timeout (on the CPU that stayed 60 s
    whatever max_steps). Checked at load on every device, and by the repository writer."""
    parameters, max_batch_size = shipped("h3_dit")
    request = {**parameters, "execution_mode": "request", "device": device, "max_steps": "400"}
    step = {"cpu": "0.200", "cuda": "0.022"}[device]  # 4,096 rows of tiny: 0.2 s on the CPU, 0.355 / 4 x 2 / 8 on cuda
    needed = {"cpu": 120, "cuda": 13}[device]
    assert DitSettings.from_parameters(request, max_batch_size, idle_s=float(needed) + 1).max_steps == 400
    with pytest.raises(ValueError) as error:
        DitSettings.from_parameters(request, max_batch_size, idle_s=needed - 1.0)
    assert str(error.value) == (
        f"h3_dit max_sequence_idle_microseconds ({needed - 1} s) is below the longest generation of execution mode "
        f"'request' (one execute): max_steps 400 x {step} s (a step of 4,096 rows on {device}, estimated) x 1.5 = "
        f"{needed} s; the requests waiting behind it would be reaped: raise the idle timeout (server.repository sizes "
        "it) or lower max_steps"
    )


def test_the_writer_sizes_request_modes_idle_timeout_on_the_cpu_and_refuses_a_shorter_one():
    request = {"h3_dit": {"execution_mode": "request", "max_steps": "400"}}
    assert plan(overrides=request).idle_microseconds == 120_000_000
    with pytest.raises(ValueError, match=r"^h3_dit max_sequence_idle_microseconds \(60 s\) is below the longest"):
        plan(overrides=request, idle_timeout_s=60)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"heartbeat_s": "0"}, "h3_vae parameter heartbeat_s=0.0 is out of range: allowed finite > 0 seconds"),
        ({"heartbeat_s": "inf"}, "h3_vae parameter heartbeat_s=inf is out of range: allowed finite > 0 seconds"),
        ({"max_queued_decodes": "-1"}, "h3_vae parameter max_queued_decodes=-1 is out of range: allowed >= 0"),
        ({"max_height": "0"}, "h3_vae parameter max_height=0 is out of range: allowed >= 1"),
    ],
)
def test_bad_vae_parameters_are_refused_at_load(change, message):
    with pytest.raises(ValueError) as refused:
        VaeSettings.from_parameters({**VaeSettings().to_parameters(), **change})
    assert str(refused.value) == message


def test_the_writer_gives_h3_vae_the_dits_canvas_limits():
    from server.repository import plan

    assert plan(overrides={"h3_dit": {"max_height": 128}}).vae.limits().max_height == 128
    given = plan(overrides={"h3_dit": {"max_height": 128}, "h3_vae": {"max_height": 128}})
    assert (given.vae.max_height, given.dit.max_height) == (128, 128)  # differing values: test_settings_agreement


@pytest.mark.parametrize("value", ["x", "random:", "random:-3", "/weights"])
def test_encoder_weights_are_empty_or_random_seed(value):
    assert EncoderSettings(encoder_weights="random:7").encoder_weights == "random:7"
    with pytest.raises(ValueError) as caught:
        EncoderSettings(encoder_weights=value)
    assert str(caught.value) == (
        f'h3_encoder parameter encoder_weights={value!r} is not allowed: "" (read the weights from the folder\'s '
        "safetensors) or random:SEED (seeded random weights) with SEED an integer in 0..9223372036854775806, "
        "e.g. random:0"
    )
