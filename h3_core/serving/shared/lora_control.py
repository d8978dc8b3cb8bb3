"""The answers to the LoRA control requests (protocol.LORA_CONTROLS; docs/lora.md §"Serving"),
whichever model takes them (h3_cancel, where clients send them), and h3_dit's `loras` setting
(lora_setting). Torch-free.

A load or unload changes the registry's adapter table (Registry.change_lora), which every h3_dit
instance reconciles with (h3_core.serving.dit.adapters.ServedAdapters.sync: at each execute, and
every ADAPTER_POLL_S while idle). The answer waits, at most `wait_s`, until every live DiT
instance has reported on that change, and then holds each instance's report:

- lora_load: "loaded" (rank, targets, bytes) or "failed" (message). When every instance failed,
  the table change is taken back and the control is refused with the first instance's message
  (INVALID_ARG), e.g. max_loras or max_lora_rank passed, an unreadable file.
- lora_unload: "unloaded", or "unloading" where a running request uses the adapter: that instance
  refuses new requests naming it at once and unloads it when its requests end (the unload waits
  until idle; it does not cut a running request short).
- an instance that did not report within `wait_s` (one busy with a long execute, e.g. execution
  mode "request"): "pending"; lora_list shows its state later.
"""

import time
from collections.abc import Callable

from h3_core.rules import LORA_NAME, LORA_NAME_RULE
from h3_core.serving.shared.registry import Registry

CONTROL_WAIT_S = 10.0  # how long a load or unload waits for the DiT instances' reports
POLL_S = 0.05  # between two reads of the reports
ADAPTER_POLL_S = 0.2  # an idle h3_dit instance reads the adapter table this often (its Triton adapter)
ENDS = {"lora_load": ("loaded", "failed"), "lora_unload": ("unloaded", "unloading")}


def lora_setting(text: str) -> dict[str, str]:
    """h3_dit parameter `loras` ("" or "NAME=PATH,...", rules.LORA_NAME) -> {name: path}; ValueError naming it."""
    named = {}
    for item in filter(None, text.split(",")):
        name, equals, path = item.partition("=")
        if not equals or not path or not LORA_NAME.fullmatch(name) or name in named:
            raise ValueError(
                f"h3_dit parameter loras={text!r} is not comma-separated NAME=PATH pairs, each NAME once and "
                f"{LORA_NAME_RULE} (e.g. 'turbo=weights/turbo.safetensors')"
            )
        named[name] = path
    return named


def lora_listing(registry: Registry) -> dict:
    """INFO of lora_list: {"kind": "lora_list", "adapters": [{"name", "path", "rank", "targets",
    "bytes" (of the first instance that holds it; absent where none does), "instances":
    {instance: its report, or {"state": "pending"} before it reconciled}}, ...]} in name order."""
    _, wanted = registry.wanted_loras()
    reports = registry.lora_reports()
    adapters = []
    for name, path in wanted.items():
        states = {}
        for instance, held in reports.items():
            report = held.get(name)
            states[instance] = report if report is not None and report["state"] != "unloaded" else {"state": "pending"}
        entry = {"name": name, "path": path}
        loaded = [report for report in states.values() if report["state"] == "loaded"]
        if loaded:
            entry.update({key: loaded[0][key] for key in ("rank", "targets", "bytes")})
        adapters.append({**entry, "instances": states})
    return {"kind": "lora_list", "adapters": adapters}


def lora_control(
    registry: Registry,
    action: str,
    name: str | None,
    path: str | None,
    wait_s: float = CONTROL_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """The INFO answer of one LoRA control request (module docstring): (action, name, path) as
    protocol.read_lora_control returns them, path already resolved on the server. Raises
    ValueError (INVALID_ARG) for a name loaded already or not loaded (Registry.change_lora) and
    for a load every instance failed (its message)."""
    if action == "lora_list":
        return lora_listing(registry)
    version = registry.change_lora(name, path if action == "lora_load" else None)
    deadline = clock() + wait_s
    while True:
        reports = {instance: held.get(name) for instance, held in registry.lora_reports().items()}
        done = {
            instance: report
            for instance, report in reports.items()
            if report is not None and report["version"] >= version and report["state"] in ENDS[action]
        }
        if len(done) == len(reports) or clock() >= deadline:
            break
        sleep(POLL_S)
    if action == "lora_load" and done and len(done) == len(reports):
        failed = [report["message"] for report in done.values() if report["state"] == "failed"]
        if len(failed) == len(done):
            registry.change_lora(name, None)
            raise ValueError(failed[0])
    states = {instance: done.get(instance, {"state": "pending"}) for instance in reports}
    return {"kind": "lora", "action": action, "name": name, "instances": states}
