"""The AdaLN table: every block's (and the final layer's) AdaLN projection of a timestep value,
computed once per distinct float32 timestep and kept on the DiT's device (issue 48, item 3).

Without it, `AdaLNProj(per_timestep=True)` streams each block's whole AdaLN weight once per
distinct timestep in the pack: for h3 about 24.2 GiB per timestep value per step (~5.4 ms on an
H200), which a pack of requests at different steps pays once per request. With it, a value's
projections are filled once by exactly the one-row calls of the per-timestep path (time embedder
of a [1] tensor, then each AdaLNProj's linear of that one row), so the stored rows are those
bits, and a step only gathers its values' rows: solo == co-batched stays bitwise
(tests/test_adaln_table.py).

Key: the float32 bits of the timestep (two timesteps are one value only when their bits are).
Storage: one tensor [capacity, n x hidden] per AdaLNProj in the model dtype, allocated once (a
CUDA graph captured against a slot keeps reading the same memory), `value_bytes(cfg)` per value
(9,698,304 B for h3: 50 x 18 x 5,376 + 2 x 5,376 bf16). Full, the least recently used value
that the current pack does not need is refilled.
"""

from collections import OrderedDict

import torch

# values kept by default: a 49-forward schedule and its condition values; 0.62 GB for h3 (server.sizing counts it)
DEFAULT_CAPACITY = 64


def value_bytes(cfg) -> int:
    """Bytes the table keeps per timestep value for a DiTConfig: (18 x num_layers + 2) x
    hidden_size elements of the model dtype."""
    return (18 * cfg.num_layers + 2) * cfg.hidden_size * cfg.torch_dtype.itemsize


class AdaLNSlots:
    """What a step's blocks read instead of t_emb when the table is on: the table and the pack's
    slots (int64 [M] on the DiT's device, one per unique timestep in the pack's order)."""

    def __init__(self, table: "AdaLNTable", slots: torch.Tensor):
        self.table, self.slots = table, slots

    def rows(self, projection) -> torch.Tensor:
        """The stored [M, n x hidden] rows of one AdaLNProj for the pack's timesteps."""
        return self.table.values[self.table.index[id(projection)]].index_select(0, self.slots)


class AdaLNTable:
    """The AdaLN projections of `dit` (an H3DiT) keyed by float32 timestep (module docstring).

    Args:
        dit: the DiT whose time_embedder, blocks' and final layer's adaln_proj fill the table.
        capacity: timestep values kept (>= 1; ValueError otherwise).
    """

    def __init__(self, dit, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"the AdaLN table needs capacity >= 1 timestep value, got {capacity}")
        self.dit, self.capacity = dit, capacity
        self.projections = [block.adaln_proj for block in dit.blocks] + [dit.final_layer.adaln_proj]
        self.index = {id(p): i for i, p in enumerate(self.projections)}
        self.values = [
            torch.empty(capacity, p.linear.out_features, dtype=p.linear.weight.dtype, device=dit.device)
            for p in self.projections
        ]
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # float32 bits -> slot, least recently used first
        self.fills = 0  # values computed so far (benchmarks report fills per step)

    @torch.inference_mode()
    def slots(self, timesteps: torch.Tensor) -> torch.Tensor:
        """The slots of float32 timesteps [M] (host or device; M <= capacity), filling the values
        not kept yet: int64 [M] on the DiT's device. Raises ValueError when M > capacity."""
        bits = timesteps.detach().to("cpu", torch.float32).contiguous().view(torch.int32).tolist()
        if len(set(bits)) > self.capacity:
            raise ValueError(
                f"a pack of {len(set(bits))} distinct timesteps exceeds the AdaLN table's {self.capacity} values"
            )
        for key, t in zip(bits, timesteps.detach().to("cpu", torch.float32).split(1), strict=True):
            if key in self.slot_of:
                self.slot_of.move_to_end(key)
                continue
            if len(self.slot_of) < self.capacity:
                slot = len(self.slot_of)
            else:
                old = next(k for k in self.slot_of if k not in bits)
                slot = self.slot_of.pop(old)
            self.fill(slot, t)
            self.slot_of[key] = slot
        return torch.tensor([self.slot_of[key] for key in bits], dtype=torch.int64).to(self.dit.device)

    def fill(self, slot: int, t: torch.Tensor) -> None:
        """Compute one value (float32 [1]) into `slot`: the one-row calls of the per-timestep path."""
        t_emb = self.dit.time_embedder(t.to(self.dit.device))
        for projection, values in zip(self.projections, self.values, strict=True):
            values[slot] = projection(t_emb)[0]
        self.fills += 1
