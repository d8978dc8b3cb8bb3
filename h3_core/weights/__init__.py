"""Weights: safetensors save and load, the DiT's weight sources (native folder, official checkpoint,
`random:SEED`), writing seeded and official checkpoints, and the hook for the official
remote-code VAEs. Imports model/ only."""
