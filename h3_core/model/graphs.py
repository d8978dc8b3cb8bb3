"""CUDA graphs of the DiT's packed forward (H3DiT.use_cuda_graphs): one graph per pack structure,
replayed for later steps of the same requests (GraphedForward)."""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from .packed import PackedBatch

# CUDA graphs (H3DiT.use_cuda_graphs): packs of at most GRAPH_MAX_ROWS rows replay a graph, at
# most GRAPHS_KEPT pack structures are kept (least recently used dropped). A 128-row step of the
# bench DiT is bound by the host, not the GPU (14.95 ms a step, 4.25 ms of kernels; issue 16);
# from about 4,096 rows the kernels dominate and a graph would only add memory.
GRAPH_MAX_ROWS, GRAPHS_KEPT = 4096, 16


@dataclass
class CapturedPack:
    """One captured forward: the graph, its static inputs (video, audio, text, unique_timesteps,
    inverse_indices, refilled before each replay), its outputs and the PackRows it reads."""

    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]
    outputs: tuple[torch.Tensor, torch.Tensor]
    rows: object  # the pack's PackRows (h3_core.model.dit)


class GraphedForward:
    """H3DiT.forward_rows replayed from CUDA graphs, one per pack structure: the key is the DiT's
    attention backend, the requests' layouts in pack order, the number of unique timesteps and
    each request's LoRA composition (PackedBatch.loras: adapter names and scales), which fix
    every kernel, every shape and every layout- and LoRA-determined tensor (PackRows); the step's
    values (latents, text states, timesteps, each row's timestep index) are copied into the
    graph's static inputs.

    A pack structure met for the first time runs forward_rows once on a side stream (its lazy
    set-up: compiled-graph guards, cuBLAS and cuDNN plans, what attention backends derive from
    Documents), is captured, then replayed; later steps of the same requests with as many unique
    timesteps only replay (a request's first step has one, video and audio at t = 0; later steps
    two). A replay runs the kernels the eager forward runs, so outputs are bitwise those of the
    eager compiled forward (checked on the H200 by benchmarks/engine_bench.py, `bitwise`, with
    sdpa). All graphs share one memory pool; outputs are cloned after each replay, so no graph's
    outputs outlive the next replay. The pool keeps the peak of the largest graphed forward
    (about 0.25 GB of fc1 output at 4,096 rows and H3 widths) besides the eager packs' memory.
    Returns forward's outputs. Raises ValueError when an input's shape does not fit the batch
    (as the eager forward's index_copy_ does), and what forward_rows raises.
    """

    def __init__(self, dit, max_rows: int = GRAPH_MAX_ROWS, kept: int = GRAPHS_KEPT):
        self.dit, self.max_rows, self.kept = dit, max_rows, kept
        self.captured: OrderedDict[tuple, CapturedPack] = OrderedDict()
        self.pool = torch.cuda.graph_pool_handle()
        self.captures = 0  # graphs captured so far (benchmarks report it)

    def __call__(
        self, video: torch.Tensor, audio: torch.Tensor, text: torch.Tensor, batch: PackedBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values = (video, audio, text, self.dit.step_timesteps(batch), batch.inverse_indices)
        key = (self.dit.attention, tuple(batch.layouts), len(batch.unique_timesteps), tuple(batch.loras))
        pack = self.captured.get(key)
        if pack is None:
            pack = self.capture(key, values, batch)
        self.captured.move_to_end(key)
        for name, static, value in zip(
            ("video", "audio", "text", "timesteps", "rows"), pack.inputs, values, strict=True
        ):
            if value.shape != static.shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}; the batch needs {tuple(static.shape)}")
            static.copy_(value)
        pack.graph.replay()
        return pack.outputs[0].clone(), pack.outputs[1].clone()

    def forget_lora(self, name: str) -> None:
        """Drop the graphs of packs in which a request used LoRA adapter `name` (they read its
        tensors; LoraAdapters.remove calls it)."""
        for key in [key for key in self.captured if any(n == name for c in key[3] for n, _ in c)]:
            del self.captured[key]

    def capture(self, key: tuple, values: tuple[torch.Tensor, ...], batch: PackedBatch) -> CapturedPack:
        device = self.dit.device
        inputs = [value.to(device).clone() for value in values]
        rows = self.dit.pack_rows(batch)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                self.dit.forward_rows(*inputs, rows)  # lazy set-up outside the capture
        finally:  # also when it raises: the inputs must not be freed while the side stream reads them
            torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.dit.forward_rows(*inputs, rows)
        self.captures += 1
        self.captured[key] = CapturedPack(graph, inputs, outputs, rows)
        while len(self.captured) > self.kept:
            self.captured.popitem(last=False)
        return self.captured[key]
