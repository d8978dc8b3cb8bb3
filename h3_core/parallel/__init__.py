"""Sequence parallelism: one packed DiT forward over several devices, the Ulysses split (ulysses)
and the worker processes with their driver, SequenceParallelDiT (workers). Imported by
h3_core.factory only; the workers build their own DiT (model/, weights/, diffusion's Engine)."""
