"""Where each model of a repository runs: `InstanceGroup` (one Triton instance_group entry) and
`instance_groups`, the one function that places h3_encoder, h3_dit and h3_vae on the CPU or the
GPUs; `side_gpu` and `dit_gpus` for the placements (shared, own, cpu: `PLACED` says each).
server.planner builds a repository's settings around them; server.repository writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from h3_core.serving.shared.settings import DitSettings, EncoderSettings, VaeSettings

from .options import DEVICES, PLACEMENTS

CPU_GROUP, GPU_GROUP = "KIND_CPU", "KIND_GPU"
PLACED = {
    "shared": "h3_encoder and h3_vae on the first GPU, beside its h3_dit instance",
    "own": "h3_encoder and h3_vae on a GPU of their own, the last; h3_dit on the others",
    "cpu": "h3_encoder and h3_vae on the CPU; h3_dit on every GPU",
}


@dataclass(frozen=True)
class InstanceGroup:
    """One Triton instance_group entry: `count` instances of `kind`, on each GPU of `gpus`."""

    kind: str
    count: int = 1
    gpus: tuple[int, ...] = ()

    @property
    def instances(self) -> int:
        """Model instances (processes) this group starts: count on each listed GPU."""
        return self.count * max(1, len(self.gpus))

    def text(self) -> str:
        """The config.pbtxt line of this group."""
        gpus = f" gpus: [ {', '.join(map(str, self.gpus))} ]" if self.gpus else ""
        return f"instance_group [ {{ kind: {self.kind} count: {self.count}{gpus} }} ]"


def side_gpu(gpus: Sequence[int], placement: str) -> int | None:
    """The GPU h3_encoder and h3_vae run on under `placement` (PLACEMENTS): gpus[0] shared,
    gpus[-1] own, None for cpu."""
    return {"shared": gpus[0], "own": gpus[-1], "cpu": None}[placement]


def dit_gpus(gpus: Sequence[int], placement: str) -> list[int]:
    """The GPUs of `gpus` that h3_dit runs on: all but the last under placement own."""
    return list(gpus[:-1] if placement == "own" else gpus)


def instance_groups(
    device: str, gpus: Sequence[int] = (), dit_instances: int = 1, sp_degree: int = 1, placement: str = "shared"
) -> dict[str, InstanceGroup]:
    """Where each python model runs. cpu: KIND_CPU, `dit_instances` of h3_dit (each running its
    steps over sp_degree worker processes when sp_degree > 1), one h3_encoder and one h3_vae.
    cuda: h3_dit's GPUs (dit_gpus: every GPU, or all but the last under placement own) in groups
    of sp_degree consecutive indices, one h3_dit instance on the first GPU of each group (count 1
    with the gpus list means one instance per listed GPU), which drives its group
    (h3_core.parallel.workers.rank_devices: its own GPU and the next sp_degree - 1), so instances
    x sp_degree = h3_dit's GPUs; one h3_encoder and one h3_vae, KIND_GPU on side_gpu (shared:
    gpus[0], beside an h3_dit instance; own: gpus[-1], alone) or KIND_CPU (placement cpu). Their
    device settings follow the group (plan()).
    Raises ValueError for an unknown device or placement, dit_instances < 1, GPUs on the CPU, no
    GPU, placement own with one GPU, dit_instances != 1 on cuda (there the DiT instances are the
    GPUs), or GPUs that do not fall into groups of sp_degree consecutive indices."""
    if device == "cpu":
        if gpus:
            raise ValueError("GPUs were given for --device cpu; use --device cuda")
        if dit_instances < 1:
            raise ValueError(f"dit_instances={dit_instances} is out of range: allowed >= 1")
        return {
            EncoderSettings.MODEL: InstanceGroup(CPU_GROUP),
            DitSettings.MODEL: InstanceGroup(CPU_GROUP, dit_instances),
            VaeSettings.MODEL: InstanceGroup(CPU_GROUP),
        }
    if device != "cuda":
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    if not gpus:
        raise ValueError("--device cuda needs at least one GPU")
    if placement not in PLACEMENTS:
        raise ValueError(f"--placement {placement!r} is not one of {PLACEMENTS}")
    if placement == "own" and len(gpus) < 2:
        raise ValueError(
            f"--placement own needs at least 2 GPUs (h3_encoder and h3_vae take the last, h3_dit the others), "
            f"got {list(gpus)}"
        )
    side, gpus = side_gpu(gpus, placement), dit_gpus(gpus, placement)
    if dit_instances != 1:
        raise ValueError(
            f"dit_instances={dit_instances}: on cuda h3_dit has one instance per GPU; choose them with --gpus"
        )
    if len(gpus) % sp_degree:
        raise ValueError(
            f"h3_dit parameter sp_degree={sp_degree} does not divide the {len(gpus)} GPUs {list(gpus)}: each "
            "h3_dit instance drives sp_degree GPUs"
        )
    groups = [list(gpus[start : start + sp_degree]) for start in range(0, len(gpus), sp_degree)]
    for group in groups:
        if group != list(range(group[0], group[0] + sp_degree)):
            raise ValueError(
                f"GPUs {group} are not consecutive: with sp_degree={sp_degree} an h3_dit instance drives "
                f"{sp_degree} consecutive GPUs from its own; list the GPUs in such groups (e.g. --gpus all)"
            )
    beside = InstanceGroup(CPU_GROUP) if side is None else InstanceGroup(GPU_GROUP, 1, (side,))
    return {
        EncoderSettings.MODEL: beside,
        DitSettings.MODEL: InstanceGroup(GPU_GROUP, 1, tuple(group[0] for group in groups)),
        VaeSettings.MODEL: beside,
    }
