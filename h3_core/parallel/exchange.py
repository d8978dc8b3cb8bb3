"""What crosses between the processes of sequence parallelism: `Arena` carries a message's
tensors from the driver to a worker (and back) through shared memory; `CollectiveExchange` is a
worker's all-to-all over its process group (h3_core.parallel.ulysses calls it twice a layer)."""

import io
import math
import os
import pickle
import time

import torch
import torch.distributed as dist


class Arena:
    """Carries the tensors of messages from one process to another through one growable block of
    shared memory instead of the pipe (a pipe copies each byte through the kernel, and torch's
    own pickling of tensors makes a shared-memory segment and passes a file descriptor per tensor
    per message, which cost about 30 ms a step for a 16,384-row pack on the 2-core CPU).

    `pack` pickles a message with each tensor replaced by its index and writes the tensors' bytes
    into the block (a new, larger block when they do not fit); `carried` is what the pipe then
    takes: the block itself only when the receiver does not hold it yet (by file descriptor,
    once), the pickled skeleton and (offset, dtype, shape) per tensor. `unpack` rebuilds the
    message with the tensors as views of the block. The block holds one message: the sender
    writes the next one only after the receiver is done with this one (a step's reply, or the
    next step)."""

    ALIGN = 64  # bytes: every tensor starts at a multiple of this

    def __init__(self):
        self.block: torch.Tensor | None = None  # uint8, in shared memory
        self.generation = 0  # bumped when the block is replaced

    def pack(self, message) -> tuple[bytes, list]:
        """Copy the tensors of `message` (any device) into the block; returns (the pickled
        skeleton, (offset, dtype, shape) per tensor)."""
        tensors = []

        def persistent_id(obj):
            if isinstance(obj, torch.Tensor):
                tensors.append(obj.detach())  # copied from its device straight into the block below
                return len(tensors) - 1
            return None

        skeleton = io.BytesIO()
        pickler = pickle.Pickler(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = persistent_id
        pickler.dump(message)
        refs, end = [], 0
        for tensor in tensors:
            refs.append((end, tensor.dtype, tuple(tensor.shape)))
            end += -(-tensor.numel() * tensor.element_size() // self.ALIGN) * self.ALIGN
        if tensors and (self.block is None or end > self.block.numel()):
            size = max(end, 2 * (0 if self.block is None else self.block.numel()), 1 << 20)
            self.block, self.generation = torch.empty(size, dtype=torch.uint8).share_memory_(), self.generation + 1
        for tensor, (offset, dtype, shape) in zip(tensors, refs, strict=True):
            self.view(self.block, offset, dtype, shape).copy_(tensor)
        return skeleton.getvalue(), refs

    def carried(self, packed: tuple[bytes, list], seen: int) -> tuple:
        """What the pipe carries for a packed message to a receiver holding the block of
        generation `seen` (0: none): (the block when that is not the current one, else None,
        skeleton, refs)."""
        return (self.block if seen != self.generation else None, *packed)

    @staticmethod
    def unpack(carried: tuple, block: torch.Tensor | None):
        """(message, block) from what `pack` returned: a new block replaces `block`."""
        new, skeleton, refs = carried
        block = block if new is None else new
        unpickler = pickle.Unpickler(io.BytesIO(skeleton))
        unpickler.persistent_load = lambda index: Arena.view(block, *refs[index])
        return unpickler.load(), block

    @staticmethod
    def view(block: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        """The tensor of `dtype` and `shape` at byte `offset` of `block`."""
        count = math.prod(shape)
        return block[offset : offset + count * dtype.itemsize].view(dtype).view(shape)


# -- the worker process ------------------------------------------------------------------------


class CollectiveError(RuntimeError):
    """A collective failed or timed out on this rank (a peer is gone or stuck)."""


class CollectiveExchange:
    """The all-to-all of a worker over its process group. `fault` (tests) acts at the next call:
    "exit" ends the process, "hang" sleeps for good, "raise" raises RuntimeError. `calls` counts
    the all-to-alls made (the worker resets it each step). With `profile` set the device is
    synchronised around each call and its seconds appended to `seconds`."""

    def __init__(self, rank: int, device: torch.device):
        self.rank, self.device = rank, device
        self.fault: str | None = None
        self.calls = 0
        self.profile = False
        self.seconds: list[float] = []

    def __call__(self, send: torch.Tensor) -> torch.Tensor:
        fault, self.fault = self.fault, None
        if fault == "exit":
            os._exit(3)
        if fault == "hang":
            while True:
                time.sleep(60)
        if fault == "raise":
            raise RuntimeError(f"injected fault in sequence-parallel rank {self.rank}")
        received = torch.empty_like(send)
        if self.profile:
            self.synchronize()
            start = time.perf_counter()
        try:
            dist.all_to_all_single(received, send)
        except Exception as error:  # noqa: BLE001 - every collective failure is a lost peer to the driver
            raise CollectiveError(f"all-to-all failed on rank {self.rank}: {type(error).__name__}: {error}") from error
        self.calls += 1
        if self.profile:
            self.synchronize()
            self.seconds.append(time.perf_counter() - start)
        return received

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
