"""The AdaLN table (h3_core.model.adaln_table, issue 48 item 3): bitwise the per-timestep
projections, solo == co-batched, one fill per distinct float32 timestep, bounded capacity, sizing."""

import pytest
import torch

from h3_core.config import get_config
from h3_core.diffusion import layout as L
from h3_core.model import H3DiT
from h3_core.model.adaln_table import AdaLNTable, value_bytes
from h3_core.model.initialization import init_weights
from h3_core.serving.shared.settings import DitSettings
from server import sizing

LAYOUTS = [L.make_layout(9, 64, 96, 22), L.make_layout(17, 64, 64, 5), L.make_layout(44, 32, 64, 5)]
T_VIDEO, T_AUDIO = [0.1, 0.5, 0.9], [0.2, 0.6, 0.9]


def tiny_dit(table: int = 0) -> H3DiT:
    dit = H3DiT(get_config("tiny"), row_tile=64)
    init_weights(dit, 0)
    if table:
        dit.use_adaln_table(table)
    return dit.eval()


def inputs(layouts, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        [torch.randn(lay.video_rows, 96, generator=g) for lay in layouts],
        [torch.randn(lay.audio_rows, 32, generator=g) for lay in layouts],
        [torch.randn(lay.text_len, 384, generator=g) for lay in layouts],
    )


def forward(dit, layouts, t_video, t_audio, values):
    batch = L.pack_requests(layouts, t_video, t_audio)
    return L.split_rows(batch, *dit(*(torch.cat(v) for v in values), batch))


def test_the_table_gives_the_per_timestep_bits_solo_and_co_batched():
    plain, tabled = tiny_dit(), tiny_dit(table=8)
    values = inputs(LAYOUTS)
    expected = forward(plain, LAYOUTS, T_VIDEO, T_AUDIO, values)
    packed = forward(tabled, LAYOUTS, T_VIDEO, T_AUDIO, values)  # a cold table: 5 values filled
    assert tabled.adaln_table.fills == 5  # 0.1, 0.2, 0.5, 0.6, 0.9
    for i in range(3):
        assert torch.equal(packed[i][0], expected[i][0]) and torch.equal(packed[i][1], expected[i][1])
        solo = forward(tabled, [LAYOUTS[i]], [T_VIDEO[i]], [T_AUDIO[i]], [[v[i]] for v in values])[0]
        assert torch.equal(solo[0], expected[i][0]) and torch.equal(solo[1], expected[i][1])
    assert tabled.adaln_table.fills == 5  # the solo steps found every value kept
    # a first step (video and audio at one timestep) and the table's stored rows themselves
    first = forward(tabled, LAYOUTS[:1], [0.7], [0.7], [[v[0]] for v in values])[0]
    assert torch.equal(first[0], forward(plain, LAYOUTS[:1], [0.7], [0.7], [[v[0]] for v in values])[0][0])
    t = torch.tensor([0.7])
    slot = tabled.adaln_table.slot_of[t.view(torch.int32).item()]
    with torch.inference_mode():
        projected = plain.blocks[1].adaln_proj(plain.time_embedder(t))
    assert torch.equal(tabled.adaln_table.values[1][slot], projected[0])
    assert tabled.adaln_table.fills == 6


def test_keys_are_float32_bits_and_a_full_table_refills_the_least_recently_used():
    dit = tiny_dit()
    table = AdaLNTable(dit, capacity=3)
    assert table.slots(torch.tensor([0.25, 0.5])).tolist() == [0, 1]
    assert table.slots(torch.tensor([0.5, 0.75])).tolist() == [1, 2]  # 0.25 now least recently used
    assert table.fills == 3
    assert table.slots(torch.tensor([0.75, 1.0])).tolist() == [2, 0]  # 1.0 takes 0.25's slot
    assert table.fills == 4
    assert list(table.slot_of) == [torch.tensor(t).view(torch.int32).item() for t in (0.5, 0.75, 1.0)]
    assert table.slots(torch.tensor([0.5])).tolist() == [1] and table.fills == 4
    with pytest.raises(ValueError, match="a pack of 4 distinct timesteps exceeds the AdaLN table's 3 values"):
        table.slots(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    with pytest.raises(ValueError, match="the AdaLN table needs capacity >= 1 timestep value, got 0"):
        AdaLNTable(dit, capacity=0)


def test_sizing_counts_the_table():
    assert value_bytes(get_config("h3")) == (50 * 18 + 2) * 5376 * 2 == 9_698_304
    h3 = get_config("h3")
    assert sizing.adaln_table_bytes(h3, DitSettings(config_name="h3")) == 64 * 9_698_304
    assert sizing.adaln_table_bytes(h3, DitSettings(config_name="h3", adaln_table_values=0)) == 0
    assert sizing.adaln_table_bytes(h3, DitSettings(config_name="h3", sp_degree=2)) == 0
    with pytest.raises(ValueError, match=r"h3_dit parameter adaln_table_values=-1 is out of range: allowed >= 0"):
        DitSettings(adaln_table_values=-1)
