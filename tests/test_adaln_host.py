"""AdaLN weights in host memory (h3_dit adaln_weights = host, issue 48 item 3): no AdaLN weight on
the DiT's device, table fills streamed from host memory bitwise equal to device-resident fills,
one fill pass per admission, trajectories solo == co-batched, the setting's refusals, sizing."""

import re
from contextlib import contextmanager

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion.engine import schedule_timesteps
from h3_core.diffusion.request import GenerationRequest
from h3_core.factory import load_engine
from h3_core.model import H3DiT
from h3_core.model.adaln_table import AdaLNTable, scratch_bytes, weight_bytes
from h3_core.serving.shared.settings import DitSettings
from h3_core.weights.checkpoint import load_dit
from server import repository as R
from server import sizing
from server.sizing import Machine
from tests.step_loop_harness import joins_by_step

GIB = 2**30
TINY = get_config("tiny")


def loaded(adaln_weights: str, table: int = 0) -> H3DiT:
    dit = H3DiT(TINY, row_tile=64, adaln_weights=adaln_weights)
    load_dit(dit, "random:0")
    if table:
        dit.use_adaln_table(table)
    return dit.eval()


def projections(dit: H3DiT):
    return [block.adaln_proj for block in dit.blocks] + [dit.final_layer.adaln_proj]


def test_host_weights_are_no_device_tensors_and_fill_the_device_bits():
    device, host = loaded("device", table=8), loaded("host", table=8)
    # no AdaLN weight or bias is a parameter or buffer on the DiT's device: they are meta there
    for name, tensor in (*host.named_parameters(), *host.named_buffers()):
        assert (tensor.device.type == "meta") == ("adaln_proj" in name), name
    assert sum("adaln_proj" in name for name, _ in host.named_parameters()) == 2 * (TINY.num_layers + 1)
    for d, h in zip(projections(device), projections(host), strict=True):  # loaded as on the device, bit for bit
        assert torch.equal(h.host[0], d.linear.weight) and torch.equal(h.host[1], d.linear.bias)
    host_bytes = sum(w.nbytes + b.nbytes for w, b in (p.host for p in projections(host)))
    assert host_bytes == weight_bytes(TINY) == (18 * 2 + 2) * 96 * (48 + 1) * 4  # tiny is float32
    assert [tuple(w.shape) for w, _ in host.adaln_table.scratch] == [(18 * 96, 48)] * 2  # one block's, twice
    # three new values: one pass over the weights, each value's rows those of the device's one-row calls
    t = torch.tensor([0.1, 0.25, 0.5])
    slots_d, slots_h = device.adaln_table.slots(t), host.adaln_table.slots(t)
    assert slots_d.tolist() == slots_h.tolist() == [0, 1, 2]
    assert (host.adaln_table.passes, host.adaln_table.fills, device.adaln_table.passes) == (1, 3, 1)
    for d, h in zip(device.adaln_table.values, host.adaln_table.values, strict=True):
        assert torch.equal(d[:3], h[:3])
    # and the per-timestep path without the table (the step cache's metric) streams them too
    with torch.inference_mode():
        t_emb = torch.cat([host.time_embedder(v) for v in t.split(1)])
        assert torch.equal(host.blocks[1].adaln_proj(t_emb), device.blocks[1].adaln_proj(t_emb))
        assert torch.equal(host.adaln_table.values[1][:3], device.blocks[1].adaln_proj(t_emb))


def test_prefill_fills_a_schedule_in_one_pass_and_keeps_to_the_capacity():
    dit = loaded("host")
    table = AdaLNTable(dit, capacity=4)
    assert table.slots(torch.tensor([0.9])).tolist() == [0] and table.passes == 1
    # 6 values, 0.9 repeated and kept: the first 4 distinct ones, 0.9's slot kept, 3 filled in one pass
    assert table.prefill(torch.tensor([0.1, 0.2, 0.1, 0.9, 0.3, 0.4, 0.5])) == 3
    assert (table.passes, table.fills) == (2, 4)
    keys = [torch.tensor(v).view(torch.int32).item() for v in (0.1, 0.2, 0.9, 0.3)]
    assert list(table.slot_of) == keys and [table.slot_of[k] for k in keys] == [1, 2, 0, 3]
    # a step that needs 0.4 and 0.5 refills the least recently used values outside its pack, in one pass
    assert table.slots(torch.tensor([0.4, 0.9, 0.5])).tolist() == [1, 0, 2]
    assert (table.passes, table.fills) == (3, 6)
    assert table.prefill(torch.tensor([0.4, 0.5])) == 0 and table.passes == 3  # nothing new: no pass


def trajectory(engine, requests, joins):
    """Step `requests` (GenerationRequest) together, request i prepared (admitted) before global
    step joins[i]; returns each one's final (video, audio) latents and the table's passes during
    the steps alone."""
    text = torch.randn(7, TINY.text_dim, generator=torch.Generator().manual_seed(5))
    table, step_passes = engine.dit.adaln_table, []

    @contextmanager
    def counted(step, pack):
        passes = table.passes
        yield
        step_passes.append(table.passes - passes)

    admit = joins_by_step(lambda request: engine.prepare(request, text), zip(joins, requests, strict=True))
    done = {s.request_id: s for s in engine.run_to_completion([], joins=admit, step_context=counted)}
    return [(done[r.request_id].video_latents, done[r.request_id].audio_latents) for r in requests], sum(step_passes)


def test_a_trajectory_with_host_weights_is_bitwise_solo_and_co_batched():
    requests = [
        GenerationRequest("p", 32, 64, 5, 4, seed=1, request_id="a"),
        GenerationRequest("p", 32, 32, 5, 3, seed=2, request_id="b", video_shift=5.0, audio_shift=2.0),
        GenerationRequest("p", 32, 64, 5, 4, seed=3, request_id="c"),  # a's schedule: no new value
    ]

    def engine(adaln_weights):
        return load_engine("tiny", "random:0", with_encoder=False, with_vaes=False, adaln_table_values=16,
                           adaln_weights=adaln_weights)  # fmt: skip

    device, host = engine("device"), engine("host")
    expected = [trajectory(device, [r], [0])[0][0] for r in requests]
    solo = [trajectory(host, [r], [0])[0][0] for r in requests]
    host = engine("host")  # a cold table: admissions mid-run fill their schedules
    packed, step_passes = trajectory(host, requests, [0, 1, 2])
    for e, s, p in zip(expected, solo, packed, strict=True):
        assert torch.equal(e[0], s[0]) and torch.equal(e[1], s[1])
        assert torch.equal(e[0], p[0]) and torch.equal(e[1], p[1])
    # one pass per admission with unseen values (a, b; c's are a's), none while stepping
    states = [device.prepare(r, torch.zeros(1, TINY.text_dim))[0] for r in requests[:2]]
    a, b = (schedule_timesteps(s.layout, s.sigmas_video, s.sigmas_audio).tolist() for s in states)
    assert (len(a), len(b), len(set(a) | set(b))) == (7, 5, 10)  # t = 0 (sigma 1) for video and audio, then
    # 3 video and 3 audio values (4 steps) or 2 and 2 (3 steps); the schedules share 0 and audio's 0.5
    assert (host.dit.adaln_table.passes, step_passes, host.dit.adaln_table.fills) == (2, 0, 10)


def test_bad_adaln_weights_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"^h3_dit parameter adaln_weights='gpu' is not one of \('device', 'host'\)$"):
        DitSettings(adaln_weights="gpu")
    message = (
        "h3_dit parameter adaln_weights=host needs sp_degree 1 and adaln_table_values >= 2 x max_steps + 2 = 102 "
        "(a schedule's values, filled at admission), got sp_degree=1 and adaln_table_values=64"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        DitSettings(adaln_weights="host")
    with pytest.raises(ValueError, match="got sp_degree=2 and adaln_table_values=102$"):
        DitSettings(adaln_weights="host", adaln_table_values=102, sp_degree=2)
    assert DitSettings(adaln_weights="host", adaln_table_values=102).adaln_weights == "host"
    assert DitSettings(adaln_weights="host", adaln_table_values=22, max_steps=10).adaln_table_values == 22
    with pytest.raises(ValueError, match=r"^h3_dit parameter adaln_weights='pinned' is not one of"):
        R.plan(overrides={"h3_dit": {"adaln_weights": "pinned"}})
    with pytest.raises(
        ValueError, match="^h3_dit parameter adaln_weights=host needs sp_degree 1 and adaln_table_values >= 1"
    ):
        load_engine("tiny", "random:0", with_encoder=False, with_vaes=False, adaln_weights="host", adaln_table_values=0)


def test_sizing_leaves_host_weights_out_and_counts_the_scratch():
    h3 = get_config("h3")
    # (18 x 50 + 2) x 5,376 x (2,688 + 1) bf16; scratch 2 x 18 x 5,376 x 2,689 bf16
    assert (weight_bytes(h3), scratch_bytes(h3)) == (26_078_739_456, 1_040_836_608)
    device = DitSettings(config_name="h3")
    host = DitSettings(config_name="h3", adaln_weights="host", adaln_table_values=102)
    assert sizing.dit_gpu_weight_bytes(h3, device) == 66_280_430_080 + 64 * 9_698_304 == 66_901_121_536
    # 66,280,430,080 - 26,078,739,456 + 1,040,836,608 + 102 x 9,698,304
    assert sizing.dit_gpu_weight_bytes(h3, host) == 42_231_754_240
    fp8 = DitSettings(config_name="h3", adaln_weights="host", adaln_table_values=102, quantization="fp8")
    assert sizing.dit_gpu_weight_bytes(h3, fp8) == 47_025_031_680 - 26_078_739_456 + 1_040_836_608 + 102 * 9_698_304
    assert sizing.dit_gpu_weight_bytes(h3, fp8) == 22_976_355_840  # 21.4 GiB
    # the writer, as tests/test_repository.py::test_gpu_sizing_golden_numbers: the bench DiT (8 layers),
    # two 42 GiB GPUs, GPU 1 holding its DiT instance alone
    overrides = {"h3_dit": {"adaln_weights": "host", "adaln_table_values": 102}, "h3_encoder": {"encoder_path": "/e"}}
    machine = Machine(16, {0: 42 * GIB, 1: 42 * GIB})
    repository = R.plan("bench", "/w", "cuda", [0, 1], machine=machine, overrides=overrides, placement="shared")
    bench = get_config("bench")
    weights = 12_052_395_520 - weight_bytes(bench) + scratch_bytes(bench) + 102 * 1_569_792
    assert (weight_bytes(bench), scratch_bytes(bench), weights) == (4_221_170_688, 1_040_836_608, 9_032_180_224)
    # (42 GiB - 9,032,180,224 B - 4,096 x 67 x 5,376 B of graph pool) / (67 x 5,376 + 12 x 768 B) -> 65,536 at most
    assert (
        "GPU 1: 43,008 MiB free - 8,613 MiB DiT weights (quantization none, AdaLN table of 102 values; AdaLN "
        "weights in pinned host memory, 4,025 MiB, not on the GPU, a 992 MiB fill scratch instead) - "
        "1,407 MiB CUDA graph pool (4,096 graphed rows) -> 65,536 rows at 67 bytes per row and unit of "
        "hidden_size 5376 (measured on an H200 in bf16, server.sizing) + 9,216 bytes per row of 12 held "
        "requests' step caches" in repository.notes
    )
    # GPU 0 also holds h3_vae and h3_encoder: (42 GiB - 9,032,180,224 B - 2 x 14,402 MiB decodes - the pool) /
    # (67 x 5,376 + 12 x 768 B) = 11,874.3 -> 11,840 rows (3,392 with the AdaLN weights on the device)
    assert repository.dit.max_batch_rows_by_gpu == "0:11840,1:65536"


def test_served_with_host_weights_a_clip_is_bitwise_the_device_servers(client, tmp_path):
    """End to end: h3_dit with adaln_weights=host (config.pbtxt -> DitSettings -> load_engine) serves
    a clip bitwise equal to the shared server's (AdaLN weights on the device)."""
    from client.api import H3Client
    from server.process import TritonServer
    from tests.serving import model_repository_copy

    request = dict(prompt="a red ball", height=64, width=96, num_frames=9, num_inference_steps=3, seed=4,
                   return_frames=True, return_audio=True)  # fmt: skip
    device = client.generate(**request)[0]
    repo = model_repository_copy(tmp_path / "repo", adaln_weights="host", adaln_table_values="802", max_steps="400")
    with TritonServer(repo, free_ports=True, log_file=tmp_path / "server.log") as server:
        host = H3Client(server.grpc_url, idle_timeout_s=120).generate(**request)[0]
    log = (tmp_path / "server.log").read_text()
    assert re.search(r"h3_dit \S+: warm-up step on cpu in [0-9.]+ s, AdaLN weights in host memory;", log), log[-3000:]
    assert host.frames.shape == device.frames.shape == (22, 64, 96, 3)  # 9 frames served as 17n+5 = 22
    assert host.frames.tobytes() == device.frames.tobytes() and host.audio.tobytes() == device.audio.tobytes()
