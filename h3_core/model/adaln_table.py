"""The AdaLN table: every block's (and the final layer's) AdaLN projection of a timestep value,
computed once per distinct float32 timestep and kept on the DiT's device (issue 48, item 3).

Without it, `AdaLNProj(per_timestep=True)` streams each block's whole AdaLN weight once per
distinct timestep in the pack: for h3 about 24.2 GiB per timestep value per step (~5.4 ms on an
H200), which a pack of requests at different steps pays once per request. With it, a value's
projections are filled once by exactly the one-row calls of the per-timestep path (time embedder
of a [1] tensor, then each AdaLNProj's F.linear of that one row), so the stored rows are those
bits, and a step only gathers its values' rows: solo == co-batched stays bitwise
(tests/test_adaln_table.py).

Key: the float32 bits of the timestep (two timesteps are one value only when their bits are).
Storage: one tensor [capacity, n x hidden] per AdaLNProj in the model dtype, allocated once (a
CUDA graph captured against a slot keeps reading the same memory), `value_bytes(cfg)` per value
(9,698,304 B for h3: 50 x 18 x 5,376 + 2 x 5,376 bf16). Full, the least recently used values
that the current pack (or the admitted schedule, `prefill`) does not need are refilled.

A fill is one pass: the K new values of a call are filled together, each projection's weight
read once for all K. With h3_dit `adaln_weights = host` (H3DiT(adaln_weights="host")) the AdaLN
weights live in host memory (pinned on a CUDA host) and are no parameters on the DiT's device:
a pass copies each projection's weight and bias into one of two reusable device scratch buffers
(`scratch_bytes`: the largest projection's, twice; on CUDA the next projection's copy runs on a
side stream while the current one computes) and runs the same one-row F.linear on it: same
shapes, dtype and kernel, so the same bits as device-resident weights. For h3 a pass reads the
24.2 GiB of AdaLN weights over PCIe once, whatever K is; `prefill` (Engine.prepare, at a
request's admission) fills its whole schedule's values in one pass, so a request costs at most
one pass when the table holds its values (DitSettings requires adaln_table_values >= 2 x
max_steps + 2 with host weights).
"""

from collections import OrderedDict

import torch

# values kept by default: a 49-forward schedule and its condition values; 0.62 GB for h3 (server.sizing counts it)
DEFAULT_CAPACITY = 64
ADALN_WEIGHTS = ("device", "host")  # h3_dit parameter adaln_weights: where the AdaLN projection weights live


def value_bytes(cfg) -> int:
    """Bytes the table keeps per timestep value for a DiTConfig: (18 x num_layers + 2) x
    hidden_size elements of the model dtype."""
    return (18 * cfg.num_layers + 2) * cfg.hidden_size * cfg.torch_dtype.itemsize


def weight_bytes(cfg) -> int:
    """Bytes of all AdaLN projection weights and biases of a DiTConfig in the model dtype (what
    adaln_weights = host keeps in host memory): (18 x num_layers + 2) x hidden_size x
    (time_embed_dim + 1) elements; 26,078,739,456 B (24.29 GiB) for h3."""
    return value_bytes(cfg) * (cfg.time_embed_dim + 1)


def scratch_bytes(cfg) -> int:
    """Device bytes of the host-weight fill's two scratch buffers: twice a block's AdaLN weight
    and bias, 2 x 18 x hidden_size x (time_embed_dim + 1) elements; 1,040,836,608 B for h3."""
    return 2 * 18 * cfg.hidden_size * (cfg.time_embed_dim + 1) * cfg.torch_dtype.itemsize


def check_adaln_weights(adaln_weights: str) -> None:
    """Raise ValueError unless `adaln_weights` is one of ADALN_WEIGHTS."""
    if adaln_weights not in ADALN_WEIGHTS:
        raise ValueError(f"h3_dit parameter adaln_weights={adaln_weights!r} is not one of {ADALN_WEIGHTS}")


def float32_keys(timesteps: torch.Tensor) -> list[int]:
    """The table's keys of float32 timesteps [M] (host or device): their bits as int32."""
    return timesteps.detach().to("cpu", torch.float32).contiguous().view(torch.int32).tolist()


class AdaLNSlots:
    """What a step's blocks read instead of t_emb when the table is on: the table and the pack's
    slots (int64 [M] on the DiT's device, one per unique timestep in the pack's order)."""

    def __init__(self, table: "AdaLNTable", slots: torch.Tensor):
        self.table, self.slots = table, slots

    def rows(self, projection) -> torch.Tensor:
        """The stored [M, n x hidden] rows of one AdaLNProj for the pack's timesteps."""
        return self.table.values[self.table.index[id(projection)]].index_select(0, self.slots)

    def projection_inputs(self) -> torch.Tensor:
        """The projections' input SiLU(t_emb) of the pack's timesteps as the fill computed it
        (AdaLNProj.project_input): [M, time_embed_dim] in the model dtype (per-request LoRA
        deltas of the AdaLN projections start from it, h3_core.model.lora)."""
        return self.table.inputs.index_select(0, self.slots)


class AdaLNTable:
    """The AdaLN projections of `dit` (an H3DiT) keyed by float32 timestep (module docstring).

    Args:
        dit: the DiT whose time_embedder, blocks' and final layer's adaln_proj fill the table
            (their weights on its device, or in host memory: AdaLNProj.host).
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
        first = self.projections[0].linear
        self.inputs = torch.empty(capacity, first.in_features, dtype=first.weight.dtype, device=dit.device)
        self.host = self.projections[0].host is not None  # adaln_weights = host: fills stream the weights
        self.scratch: list[tuple[torch.Tensor, torch.Tensor]] = []
        if self.host:
            largest = max(self.projections, key=lambda p: p.host[0].numel())
            self.scratch = [tuple(torch.empty_like(t, device=dit.device) for t in largest.host) for _ in range(2)]
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # float32 bits -> slot, least recently used first
        self.fills = 0  # values computed so far (benchmarks report fills per step)
        self.passes = 0  # fill passes so far: each reads every projection's weight once

    @torch.inference_mode()
    def slots(self, timesteps: torch.Tensor) -> torch.Tensor:
        """The slots of float32 timesteps [M] (host or device; M <= capacity), filling the values
        not kept yet in one pass: int64 [M] on the DiT's device. Raises ValueError when M > capacity."""
        keys = float32_keys(timesteps)
        if len(set(keys)) > self.capacity:
            raise ValueError(
                f"a pack of {len(set(keys))} distinct timesteps exceeds the AdaLN table's {self.capacity} values"
            )
        self.place(keys, timesteps)
        return torch.tensor([self.slot_of[key] for key in keys], dtype=torch.int64).to(self.dit.device)

    @torch.inference_mode()
    def prefill(self, timesteps: torch.Tensor) -> int:
        """Fill a request's schedule at admission (Engine.prepare): of its float32 timesteps [K]
        (host or device, in the order its steps need them, repeats allowed) the first `capacity`
        distinct values, those not kept yet filled in one pass; kept ones become most recently
        used. A full table refills its least recently used values outside `timesteps`; values
        beyond the capacity are filled by the steps that need them. Returns the values filled."""
        keys = float32_keys(timesteps)
        first = {}
        for key, t in zip(keys, timesteps.detach().to("cpu", torch.float32).split(1), strict=True):
            first.setdefault(key, t)
        kept = list(first)[: self.capacity]
        return self.place(kept, torch.cat([first[key] for key in kept])) if kept else 0

    def place(self, keys: list[int], timesteps: torch.Tensor) -> int:
        """Give `keys` (at most `capacity` distinct ones; of the float32 `timesteps`, one each) slots,
        most recently used last, and fill the new ones in one pass: free slots first, then those of
        the least recently used values outside `keys`. Returns the values filled."""
        wanted, used = set(keys), set(self.slot_of.values())
        free = [slot for slot in range(self.capacity) if slot not in used]
        evictable = [key for key in self.slot_of if key not in wanted]  # least recently used first
        new = []
        for key, t in zip(keys, timesteps.detach().to("cpu", torch.float32).split(1), strict=True):
            if key in self.slot_of:
                self.slot_of.move_to_end(key)
                continue
            slot = free.pop(0) if free else self.slot_of.pop(evictable.pop(0))
            self.slot_of[key] = slot
            new.append((slot, t))
        if new:
            self.fill([slot for slot, _ in new], torch.cat([t for _, t in new]))
        return len(new)

    def fill(self, slots: list[int], timesteps: torch.Tensor) -> None:
        """Compute K values (float32 [K]) into `slots` in one pass: for each value the time
        embedder's one-row call, then for each projection (its weight read once: on the device,
        or streamed to a scratch buffer) each value's one-row F.linear (AdaLNProj.project)."""
        device = self.dit.device
        inputs = [self.projections[0].project_input(self.dit.time_embedder(t.to(device))) for t in timesteps.split(1)]
        for projection, values, (weight, bias) in zip(self.projections, self.values, self.weights(), strict=True):
            for slot, x in zip(slots, inputs, strict=True):
                values[slot] = projection.project(x, weight, bias)[0]
        for slot, x in zip(slots, inputs, strict=True):
            self.inputs[slot] = x[0]
        self.fills += len(slots)
        self.passes += 1

    def weights(self):
        """Each projection's (weight, bias) on the DiT's device, in projection order: its
        parameters, or (host weights) a scratch buffer holding its copy, the next projection's
        copy running on a side stream (CUDA) while the current one computes."""
        if not self.host:
            yield from ((p.linear.weight, p.linear.bias) for p in self.projections)
            return
        device = self.dit.device
        cuda = device.type == "cuda"
        side = torch.cuda.Stream(device) if cuda else None

        def start(i: int):
            host_weight, host_bias = self.projections[i].host
            buffer_weight, buffer_bias = self.scratch[i % 2]
            weight = buffer_weight.view(-1)[: host_weight.numel()].view(host_weight.shape)
            bias = buffer_bias[: host_bias.numel()]
            if not cuda:
                weight.copy_(host_weight), bias.copy_(host_bias)
                return weight, bias, None
            side.wait_stream(torch.cuda.current_stream(device))  # the buffer's last reader has run
            with torch.cuda.stream(side):
                weight.copy_(host_weight, non_blocking=True), bias.copy_(host_bias, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
            return weight, bias, done

        pending = start(0)
        for i in range(len(self.projections)):
            weight, bias, done = pending
            if i + 1 < len(self.projections):
                pending = start(i + 1)
            if done is not None:
                torch.cuda.current_stream(device).wait_event(done)
            yield weight, bias
