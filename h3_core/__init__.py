"""h3_core: a pure-PyTorch implementation of the MiniMax-H3 text-to-video+audio DiT and its
step-execution contract (see docs/model.md). No Triton imports live here.

Rooms, dependencies pointing down: serving -> diffusion -> model; weights -> model; parallel ->
diffusion, weights, model; factory (load_engine) is the one module that puts diffusion, weights and
parallel together, and demo sits on top. protocol, config and media are below them all
(tests/test_imports.py checks this)."""
