"""LoRA adapters served (issue 50 items 1 and 3; docs/lora.md §"Serving"): the request field `lora`
read by one rule on every entry point, and h3_dit's adapters (named at start, loaded, unloaded and
listed at run time through h3_cancel's control requests, on every instance, within max_loras and
max_lora_rank).

End to end: one module-scoped tritonserver with two h3_dit instances, adapter "style" named at
start (h3_dit parameter loras), max_loras 2 and max_lora_rank 4; the tests run in file order and
each leaves the adapter table as the next expects ("style", then "extra" loaded and unloaded)."""

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from client.api import H3Client, H3Error
from client.generate import parse_args
from h3_core.config import get_config
from h3_core.model.lora import part_rank
from h3_core.protocol import LORA_CONTROLS, lora_list, read_lora_control
from h3_core.rules import InvalidRequest
from h3_core.serving.shared.lora_control import lora_control, lora_listing, lora_setting
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings
from h3_core.weights.lora_formats import lora_targets, read_lora, reserve_bytes
from server.sizing import lora_bytes

from .serving import generate_in_thread, model_repository_copy

CFG = get_config("tiny")
REQUEST = dict(height=64, width=96, num_frames=5, num_inference_steps=2, seed=3, return_frames=True)
PROMPT = "a lantern in the rain"


def write_adapter(path, seed: int, rank: int = 4, targets=("attn.qkv_proj", "mlp.fc2")) -> str:
    """A FlashGen-named adapter for the tiny DiT (every block's `targets`, A and B drawn from
    `seed`, alpha = rank); returns its path."""
    shapes, generator = lora_targets(CFG), torch.Generator().manual_seed(seed)
    tensors = {}
    for block in range(CFG.num_layers):
        for target in targets:
            out, inp = shapes[f"blocks.{block}.{target}"]
            tensors[f"transformer.blocks.{block}.{target}.lora_A.weight"] = torch.randn(rank, inp, generator=generator)
            tensors[f"transformer.blocks.{block}.{target}.lora_B.weight"] = torch.randn(out, rank, generator=generator)
    save_file(tensors, str(path), metadata={"lora_rank": str(rank), "lora_alpha": str(rank)})
    return str(path)


# In-process: the one rule and the settings.


@pytest.mark.parametrize(
    "value,expected",
    [
        ('[{"name": "style", "scale": 0.5}, {"name": "turbo"}]', (("style", 0.5), ("turbo", 1.0))),
        ([("style", 1), {"name": "turbo", "scale": -2.0}], (("style", 1.0), ("turbo", -2.0))),
        (["style:0.25", "turbo"], (("style", 0.25), ("turbo", 1.0))),
        (None, ()),
        ("", ()),
        ("[]", ()),
    ],
)
def test_lora_list_reads_every_entry_form(value, expected):
    assert lora_list(value) == expected


@pytest.mark.parametrize(
    "value,message",
    [
        (
            '[{"name": "a b"}]',
            "lora name 'a b' is not allowed: allowed 1..64 letters, digits, '_', '.' or '-', "
            "the first a letter or digit",
        ),
        (
            '[{"name": "style"}, {"name": "style", "scale": 2}]',
            "lora names 'style' twice: each adapter at most once a request",
        ),
        ('[{"name": "style", "scale": 4.5}]', "lora 'style' scale=4.5 is out of range: allowed -4.0..4.0"),
        ('[{"name": "style", "scale": true}]', "lora 'style' scale=True is not a finite number"),
        (
            '[{"name": "style", "weight": 1}]',
            "lora entry {'name': 'style', 'weight': 1} is not an object of 'name' "
            "and optional 'scale' (unknown: ['weight'])",
        ),
        (["style:x"], "lora 'style:x': scale 'x' is not a number (NAME[:SCALE])"),
        ("{", "lora '{' is not a JSON array of adapters"),
        ('{"name": "style"}', "lora must be a list of adapters, got {'name': 'style'}"),
    ],
)
def test_lora_list_refuses_naming_the_field(value, message):
    with pytest.raises(InvalidRequest) as error:
        lora_list(value)
    assert (error.value.field, str(error.value)) == ("lora", message)


def test_cli_lora_flags_compose_in_order(tmp_path, capsys):
    args = parse_args(["--prompt", "x", "--out", str(tmp_path / "a.mp4"), "--lora", "turbo", "--lora", "style:0.5"])
    assert args.lora == [("turbo", 1.0), ("style", 0.5)]
    with pytest.raises(SystemExit):
        parse_args(["--prompt", "x", "--out", str(tmp_path / "a.mp4"), "--lora", "turbo", "--lora", "turbo:2"])
    assert "--lora: lora names 'turbo' twice: each adapter at most once a request" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--prompt", "x", "--out", str(tmp_path / "a.mp4"), "--lora", "turbo:9"])
    assert "argument --lora: must be NAME[:SCALE]" in capsys.readouterr().err
    request = tmp_path / "sglang.json"  # SGLang's H3 JSON has no lora field: --lora stays
    request.write_text('{"task": "t2va", "prompt": "p"}')
    args = parse_args(["--request", str(request), "--out", str(tmp_path / "b.mp4"), "--lora", "style:2"])
    assert (args.prompt, args.lora) == ("p", [("style", 2.0)])


def test_settings_and_control_requests_are_checked():
    assert lora_setting("turbo=weights/t.safetensors,style=/abs/s.safetensors") == {
        "turbo": "weights/t.safetensors",
        "style": "/abs/s.safetensors",
    }
    with pytest.raises(ValueError, match=r"^h3_dit parameter loras='turbo' is not comma-separated NAME=PATH pairs"):
        DitSettings(loras="turbo")
    with pytest.raises(ValueError) as error:
        DitSettings(loras="a=x,b=y", max_loras=1)
    assert str(error.value) == "h3_dit parameter max_loras=1 is out of range: allowed -1 or >= the loras named"
    assert (DitSettings(loras="a=x,b=y").lora_slots, DitSettings(max_loras=3).lora_slots, DitSettings().lora_slots) == (
        2,
        3,
        0,
    )
    assert read_lora_control(['{"lora_load": {"name": "a", "path": "/x"}}']) == ("lora_load", "a", "/x")
    assert read_lora_control(['{"lora_list": {}}']) == ("lora_list", None, None)
    assert read_lora_control(['{"cancel_request_id": "x"}']) is None
    with pytest.raises(ValueError, match=r"^lora_unload must be an object of \['name'\], got \{\"path\": \"/x\"\}$"):
        read_lora_control(['{"lora_unload": {"path": "/x"}}'])
    assert set(LORA_CONTROLS) == {"lora_load", "lora_unload", "lora_list"}


def test_the_writer_reads_lora_paths_against_the_current_directory(tmp_path, monkeypatch, capsys):
    from server.repository import main

    monkeypatch.chdir(tmp_path)  # as `--set h3_dit.loras=...` through server.launch or server.repository
    assert main([str(tmp_path / "repo"), "--unsized", "--set", "h3_dit.loras=turbo=weights/t.safetensors"]) == 0
    text = (tmp_path / "repo" / "h3_dit" / "config.pbtxt").read_text()
    assert f'{{ key: "loras" value: {{ string_value: "turbo={tmp_path}/weights/t.safetensors" }} }}' in text
    assert main([str(tmp_path / "bad"), "--unsized", "--set", "h3_dit.loras=turbo"]) == 2
    assert capsys.readouterr().err.startswith("python -m server.repository: h3_dit parameter loras='turbo' is not")


def test_rank_and_reserve_follow_the_targets(tmp_path):
    adapter = read_lora(write_adapter(tmp_path / "a.safetensors", 1, rank=6), CFG)
    assert part_rank(adapter) == 6  # mlp.fc2's 6; qkv_proj's 6 rows are 2 per part
    # one adapter slot of rank r: r x (in + out) per linear, 3r for a stacked qkv_proj
    expected = sum(
        (3 if name.endswith("qkv_proj") else 1) * 4 * (inp + out) for name, (out, inp) in lora_targets(CFG).items()
    )
    assert reserve_bytes(CFG, 4, 2) == 2 * expected
    # sizing reserves lora_slots adapters of max_lora_rank on the GPU (h3, bf16: 3,232,595,968 B an adapter)
    h3 = get_config("h3")
    assert lora_bytes(h3, DitSettings(max_loras=2)) == 2 * 3_232_595_968
    assert lora_bytes(h3, DitSettings(loras="turbo=t.safetensors", max_lora_rank=64)) == 3_232_595_968 // 2
    assert lora_bytes(h3, DitSettings()) == 0


def test_a_control_answers_pending_instances_and_takes_back_a_load_every_instance_refused(tmp_path):
    dit, control = Registry(tmp_path, "h3_dit_0"), Registry(tmp_path)  # a DiT instance, h3_cancel
    answer = lora_control(control, "lora_load", "a", "/x.safetensors", wait_s=0)
    assert answer == {
        "kind": "lora",
        "action": "lora_load",
        "name": "a",
        "instances": {"h3_dit_0": {"state": "pending"}},
    }
    assert dit.wanted_loras() == (1, {"a": "/x.safetensors"})

    def refuse(_seconds):  # the instance reconciles while the control waits
        dit.report_lora("b", dit.lora_version(), {"state": "failed", "message": "no room"})

    with pytest.raises(ValueError, match=r"^no room$"):
        lora_control(control, "lora_load", "b", "/y.safetensors", sleep=refuse)
    assert dit.wanted_loras() == (3, {"a": "/x.safetensors"})  # b's entry taken back
    dit.report_lora("a", 1, {"state": "loaded", "rank": 4, "targets": 2, "bytes": 64})
    assert lora_listing(control)["adapters"] == [
        {
            "name": "a",
            "path": "/x.safetensors",
            "rank": 4,
            "targets": 2,
            "bytes": 64,
            "instances": {"h3_dit_0": {"state": "loaded", "rank": 4, "targets": 2, "bytes": 64, "version": 1}},
        }
    ]


# Through a real tritonserver.


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, client, adapter paths) of the module's server (module docstring)."""
    from server.process import TritonServer

    folder = tmp_path_factory.mktemp("lora")
    paths = {name: write_adapter(folder / f"{name}.safetensors", seed) for seed, name in enumerate(("style", "extra"))}
    paths["third"] = write_adapter(folder / "third.safetensors", 7)
    paths["wide"] = write_adapter(folder / "wide.safetensors", 8, rank=8, targets=("mlp.fc2",))
    repo = model_repository_copy(
        folder / "repo",
        dit_instances=2,
        max_steps="400",
        loras=f"style={paths['style']}",
        max_loras="2",
        max_lora_rank="4",
    )
    with TritonServer(repo, free_ports=True, log_file=folder / "server.log") as server:
        yield server, H3Client(server.grpc_url, idle_timeout_s=120), paths


def in_process(paths: dict, lora: tuple) -> np.ndarray:
    """REQUEST's frames computed here (one CPU thread, as the served models) with `lora`."""
    from h3_core.diffusion.request import GenerationRequest
    from h3_core.factory import load_engine
    from h3_core.weights.checkpoint_setup import DEFAULT_ROOT

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = load_engine("tiny", DEFAULT_ROOT / "tiny")
        for name, _ in lora:
            engine.add_lora(name, read_lora(paths[name], CFG))
        request = GenerationRequest(PROMPT, 64, 96, 5, 2, seed=3, lora=lora)
        ((_, frames, _),) = engine.generate(request)
    finally:
        torch.set_num_threads(threads)
    return frames.numpy()


def test_a_started_adapter_is_listed_on_both_instances(served):
    _, client, paths = served
    (adapter,) = client.lora_control("lora_list")["adapters"]
    held = read_lora(paths["style"], CFG)
    assert (adapter["name"], adapter["path"]) == ("style", paths["style"])
    assert (adapter["rank"], adapter["targets"], adapter["bytes"]) == (4, 2 * CFG.num_layers, held.bytes)
    assert len(adapter["instances"]) == 2
    assert {report["state"] for report in adapter["instances"].values()} == {"loaded"}


def test_a_request_with_an_adapter_is_the_in_process_result_and_cobatched_its_solo(served):
    _, client, paths = served
    (plain,) = client.generate(PROMPT, **REQUEST)
    (styled,) = client.generate(PROMPT, **REQUEST, lora=[("style", 1.0)])
    assert styled.info["lora"] == [{"name": "style", "scale": 1.0}] and "lora" not in plain.info
    assert not np.array_equal(styled.frames, plain.frames)
    assert np.array_equal(styled.frames, in_process(paths, (("style", 1.0),)))
    outcome = {}  # both at once: whatever the packs, each is bitwise its solo
    threads = [
        generate_in_thread(client, outcome, "plain", prompt=PROMPT, **REQUEST),
        generate_in_thread(client, outcome, "styled", prompt=PROMPT, **REQUEST, lora=[{"name": "style"}]),
    ]
    for thread in threads:
        thread.join(300)
    assert np.array_equal(outcome["plain"][0].frames, plain.frames)
    assert np.array_equal(outcome["styled"][0].frames, styled.frames)


def test_an_unknown_adapter_is_invalid_arg(served):
    _, client, _ = served
    with pytest.raises(H3Error) as error:
        client.generate(PROMPT, **REQUEST, lora=[("nope", 1.0)])
    assert error.value.code == "INVALID_ARG"
    assert error.value.message == "lora 'nope' is not a loaded LoRA adapter (loaded: style)"


def test_load_at_run_time_reaches_both_instances_then_serves(served):
    _, client, paths = served
    answer = client.lora_control("lora_load", "extra", paths["extra"])
    assert (answer["kind"], answer["action"], answer["name"]) == ("lora", "lora_load", "extra")
    assert [report["state"] for report in answer["instances"].values()] == ["loaded", "loaded"]
    (extra,) = client.generate(PROMPT, **REQUEST, lora=["extra:0.5"])
    assert extra.info["lora"] == [{"name": "extra", "scale": 0.5}]
    assert np.array_equal(extra.frames, in_process(paths, (("extra", 0.5),)))


def test_loads_beyond_max_loras_or_max_lora_rank_are_refused_naming_the_numbers(served):
    _, client, paths = served
    with pytest.raises(H3Error) as error:
        client.lora_control("lora_load", "third", paths["third"])
    assert (error.value.code, error.value.message) == (
        "INVALID_ARG",
        "LoRA adapter 'third' refused: 2 adapters are loaded, h3_dit max_loras=2 (unload one first)",
    )
    with pytest.raises(H3Error) as error:
        client.lora_control("lora_load", "extra", paths["third"])
    assert error.value.message == "LoRA adapter 'extra' is already loaded: unload it first"
    with pytest.raises(H3Error) as error:
        client.lora_control("lora_load", "wide", "/no/such/file.safetensors")
    assert error.value.message == (
        "lora_load path '/no/such/file.safetensors' is not a file on the server (/no/such/file.safetensors)"
    )
    assert [a["name"] for a in client.lora_control("lora_list")["adapters"]] == ["extra", "style"]


def test_unload_while_in_use_waits_for_the_request_and_refuses_new_ones(served):
    _, client, paths = served
    outcome, running = {}, threading.Event()
    thread = generate_in_thread(
        client,
        outcome,
        "long",
        prompt=PROMPT,
        height=64,
        width=96,
        num_frames=5,
        num_inference_steps=400,
        progress_every=1,
        request_id="lora-long",
        lora=[("extra", 1.0)],
        on_progress=lambda *_: running.set(),
    )
    assert running.wait(120)
    answer = client.lora_control("lora_unload", "extra")
    states = sorted(report["state"] for report in answer["instances"].values())
    assert states == ["unloaded", "unloading"]
    (waiting,) = [r for r in answer["instances"].values() if r["state"] == "unloading"]
    assert waiting["message"] == (
        "LoRA adapter 'extra' is in use by request(s) 'lora-long': remove it once they finish or are cancelled"
    )
    with pytest.raises(H3Error) as error:  # on either instance
        client.generate(PROMPT, **REQUEST, lora=[("extra", 1.0)])
    assert error.value.message == "lora 'extra' is not a loaded LoRA adapter (loaded: style)"
    assert client.cancel("lora-long") == "cancelled"
    thread.join(120)
    # once its request ended the adapter goes: a rank refusal now names the rank, not max_loras
    with pytest.raises(H3Error) as error:
        client.lora_control("lora_load", "wide", paths["wide"])
    assert error.value.message == "LoRA adapter 'wide' refused: rank 8, allowed 1..4 (h3_dit max_lora_rank)"
    with pytest.raises(H3Error) as error:
        client.lora_control("lora_unload", "extra")
    assert error.value.message == "LoRA adapter 'extra' is not loaded"
    assert [a["name"] for a in client.lora_control("lora_list")["adapters"]] == ["style"]


def test_videos_api_lora_field_and_admin_routes(served):
    """The Videos API: the form field `lora` (repeated NAME[:SCALE] or a JSON array) reaches the
    server; the admin routes list, load and unload, refused without an admin key (OpenAI's shape)."""
    from fastapi.testclient import TestClient

    from videos_api.app import Settings, create_app

    server, _, paths = served
    keys = {"admin-key": True, "user-key": False}
    settings = Settings(triton_url=server.grpc_url, data_dir=Path(paths["style"]).parent / "api", api_keys=keys)
    admin, user = {"Authorization": "Bearer admin-key"}, {"Authorization": "Bearer user-key"}
    with TestClient(create_app(settings)) as http:
        refused = http.get("/v1/loras", headers=user)
        assert refused.status_code == 403
        assert refused.json() == {
            "error": {
                "message": "PERMISSION_DENIED: the LoRA routes need an admin key ('KEY admin' in the key file)",
                "type": "invalid_request_error",
                "param": None,
                "code": "PERMISSION_DENIED",
            }
        }
        assert http.post("/v1/loras", json={"name": "extra", "path": paths["extra"]}).status_code == 401
        listed = http.get("/v1/loras", headers=admin).json()
        assert [entry["name"] for entry in listed["data"]] == ["style"]
        loaded = http.post("/v1/loras", headers=admin, json={"name": "extra", "path": paths["extra"]})
        assert loaded.status_code == 200 and loaded.json()["action"] == "lora_load"
        assert sorted(report["state"] for report in loaded.json()["instances"].values()) == ["loaded", "loaded"]
        form = {"prompt": PROMPT, "size": "96x64", "num_frames": "5", "num_inference_steps": "2", "seed": "3"}
        sync = http.post("/v1/videos/sync", headers=user, data={**form, "lora": ["extra:0.5", "style"]})
        assert sync.status_code == 200 and sync.headers["content-type"] == "video/mp4"
        unknown = http.post("/v1/videos/sync", headers=user, data={**form, "lora": '[{"name": "nope"}]'})
        assert unknown.status_code == 400
        assert unknown.json()["error"]["message"] == (
            "INVALID_ARG: lora 'nope' is not a loaded LoRA adapter (loaded: extra, style)"
        )
        assert unknown.json()["error"]["param"] == "lora"
        with_path = http.post("/v1/videos", headers=user, data={**form, "lora": '[{"name": "x", "path": "/etc"}]'})
        assert with_path.status_code == 400 and with_path.json()["error"]["param"] == "lora"
        assert http.delete("/v1/loras/extra", headers=admin).json()["instances"] != {}
        gone = http.delete("/v1/loras/extra", headers=admin)
        assert (gone.status_code, gone.json()["error"]["message"]) == (
            400,
            "INVALID_ARG: LoRA adapter 'extra' is not loaded",
        )


def test_the_page_sends_its_lora_field(served, tmp_path):
    """The page's LoRA field (NAME[:SCALE], comma-separated) reaches h3_dit: an adapter it does not
    hold comes back as the page's error, naming the field's entry."""
    from selenium.webdriver.common.by import By

    from .test_videos_page import chromium, open_with_key
    from .videos_api_serving import FrontEnd, wait_for

    server, _, _ = served
    with FrontEnd(server.grpc_url, tmp_path / "data") as front_end:
        browser = chromium()
        try:
            find = open_with_key(browser, front_end.url)
            find(By.ID, "prompt").send_keys(PROMPT)
            find(By.ID, "size").send_keys("96x64")
            find(By.ID, "steps").send_keys("2")
            find(By.ID, "lora").send_keys("style:0.5, nope")
            find(By.ID, "generate").click()
            refused = "INVALID_ARG: lora 'nope' is not a loaded LoRA adapter (loaded: style)"
            wait_for(lambda: find(By.ID, "error").text == refused, 60, "the refusal on the page")
        finally:
            browser.quit()


def test_one_bad_lora_is_refused_by_the_one_rule_on_every_entry_point(tmp_path, capsys):
    """rules.lora_list refuses it, and every entry point keeps that error in its chain."""
    from client.inputs import lora_input
    from h3_core.request_model import RequestError, read_vllm_omni
    from videos_api.fields import ApiError, form_fields, parse_create

    from .test_one_rule import dit, rule_error

    bad, message = '[{"name": "style", "scale": 9}]', "lora 'style' scale=9.0 is out of range: allowed -4.0..4.0"
    with pytest.raises(InvalidRequest) as core:
        lora_list(bad)
    assert (core.value.field, str(core.value)) == ("lora", message)
    with pytest.raises(InvalidRequest) as admission:  # h3_dit's admission of REQUEST's "lora"
        dit({"lora": [{"name": "style", "scale": 9}]})
    assert str(admission.value) == message
    with pytest.raises(ApiError) as api:
        parse_create(form_fields([("prompt", "p"), ("lora", bad)]), "h3")
    assert (api.value.status, api.value.message, api.value.param) == (400, f"INVALID_ARG: {message}", "lora")
    with pytest.raises(RequestError) as vllm:
        read_vllm_omni({"prompt": "p", "lora": bad})
    assert (vllm.value.path, vllm.value.text) == ("lora", message)
    with pytest.raises(InvalidRequest) as client:  # H3Client.generate(lora=...) builds its input with it
        lora_input([("style", 9)])
    assert str(vllm.value.__cause__) == message
    for error in (api.value, client.value):
        assert str(rule_error(error)) == message
    with pytest.raises(SystemExit):
        parse_args(["--prompt", "x", "--out", str(tmp_path / "a.mp4"), "--lora", "style:9"])
    assert "argument --lora: must be NAME[:SCALE]" in capsys.readouterr().err
