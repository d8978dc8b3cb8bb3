"""h3_dit's LoRA adapters (docs/lora.md §"Serving"): the adapters an instance holds follow the
registry's adapter table, which every h3_dit instance of the server reads.

The table (h3_core.serving.shared.registry: name -> path on the server's disk, and a version) is
written by the adapters named at start (h3_dit parameter `loras`, seeded once per server) and by
the control requests h3_cancel takes (`lora_load`, `lora_unload`). Each instance reconciles its
engine with it (`ServedAdapters.sync`): before each execute's arrivals are admitted, and while
idle from a polling thread of the Triton adapter (model_repository/h3_dit/1/model.py). It loads
what it lacks (h3_core.weights.lora_formats.read_lora + Engine.add_lora), unloads what the table
dropped, and reports each name's state to the registry: "loaded" with rank, targets and bytes,
"failed" with the reason, "unloading" while a running request uses it (the adapter then takes no
new request, Engine.closed_loras, and goes once its requests end), "unloaded". A request is admitted
only where its adapters are loaded (Engine.check_loras_loaded). No path comes from a generation
request: only the operator's setting and the control requests name files.
"""

import logging
from collections.abc import Callable
from pathlib import Path

from h3_core.diffusion.engine import Engine
from h3_core.model.lora import part_rank
from h3_core.serving.shared.lora_control import lora_setting
from h3_core.serving.shared.registry import Registry
from h3_core.serving.shared.settings import DitSettings

log = logging.getLogger("h3_dit")


class ServedAdapters:
    """One h3_dit instance's adapters. `engine`: its Engine; `registry`: the server's Registry
    as this instance; `settings`: h3_dit's (loras, max_loras, max_lora_rank); `resolve`: a path
    as the operator wrote it -> the file (relative ones from the folder above the model
    repository); `read`: path, DiTConfig -> h3_core.weights.lora_formats.LoraAdapter (read_lora,
    passed by the Triton adapter: a serving room imports no weights module)."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        settings: DitSettings,
        resolve: Callable[[str], Path],
        read: Callable,
    ):
        self.engine, self.registry, self.settings, self.resolve, self.read = engine, registry, settings, resolve, read
        self.version = -1  # the table version last reconciled

    def start(self) -> None:
        """Load the adapters of h3_dit parameter `loras` (the first instance seeds the registry's
        table with them; a table already written, by a sibling or at run time, is what counts),
        then reconcile. Raises ValueError naming the adapter when one of the setting's cannot be
        loaded here: the operator's own files fail the start."""
        named = lora_setting(self.settings.loras)
        self.registry.seed_loras(named)
        version, wanted = self.registry.wanted_loras()
        for name, path in wanted.items():
            if name in named:
                try:
                    self.load(name, path)
                except (OSError, ValueError) as error:
                    raise ValueError(f"h3_dit parameter loras: adapter {name!r} ({path}): {error}") from error
        self.sync()

    def load(self, name: str, path: str) -> dict:
        """Read and hold adapter `name` from `path`; returns its report. Raises ValueError naming
        the numbers when max_loras adapters are held already or its rank passes max_lora_rank,
        OSError / ValueError as read_lora and Engine.add_lora do."""
        held = len(self.engine.loras())
        if held >= self.settings.lora_slots:
            raise ValueError(
                f"LoRA adapter {name!r} refused: {held} adapters are loaded, h3_dit max_loras="
                f"{self.settings.lora_slots} (unload one first)"
            )
        adapter = self.read(self.resolve(path), self.engine.dit.cfg)
        rank = part_rank(adapter)
        if rank > self.settings.max_lora_rank:
            raise ValueError(
                f"LoRA adapter {name!r} refused: rank {rank}, allowed 1..{self.settings.max_lora_rank} "
                "(h3_dit max_lora_rank)"
            )
        self.engine.add_lora(name, adapter)
        return self.report(name)

    def report(self, name: str) -> dict:
        """A held adapter's report: state "loaded", rank (part_rank, as max_lora_rank compares it),
        targets (linears it changes), bytes (its A and B on the device)."""
        entry = next(entry for entry in self.engine.loras() if entry["name"] == name)
        rank = part_rank(self.engine.lora_holder().adapters[name])
        return {"state": "loaded", "rank": rank, "targets": entry["targets"], "bytes": entry["bytes"]}

    def sync(self) -> None:
        """Reconcile the engine with the registry's table when its version changed, and retry
        the unloads that waited for their requests (cheap otherwise: one read)."""
        version = self.registry.lora_version()
        if version == self.version and not self.engine.closed_loras:
            return
        version, wanted = self.registry.wanted_loras()
        held = {entry["name"] for entry in self.engine.loras()}
        self.engine.closed_loras -= set(wanted)  # loaded again before its unload ended: it stays, open again
        for name in sorted(held - set(wanted)):
            try:
                self.engine.remove_lora(name)
            except ValueError as error:  # in use: no new request takes it; it goes when they end
                if name not in self.engine.closed_loras:
                    self.engine.closed_loras.add(name)
                    self.registry.report_lora(name, version, {"state": "unloading", "message": str(error)})
                continue
            self.engine.closed_loras.discard(name)
            self.registry.report_lora(name, version, {"state": "unloaded"})
            log.info("LoRA adapter %r unloaded", name)
        if version != self.version:
            for name in sorted(set(wanted) - held):
                try:
                    report = self.load(name, wanted[name])
                    log.info("LoRA adapter %r loaded from %s", name, wanted[name])
                except Exception as error:  # noqa: BLE001 - reported to the control and the list, the server goes on
                    report = {"state": "failed", "message": f"{error}"}
                    log.error("LoRA adapter %r (%s) not loaded: %s", name, wanted[name], error)
                self.registry.report_lora(name, version, report)
            for name in sorted(held & set(wanted)):
                self.registry.report_lora(name, version, self.report(name))
        self.version = version
