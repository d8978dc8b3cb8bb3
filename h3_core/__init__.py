"""h3_core: a pure-PyTorch implementation of the MiniMax-H3 text-to-video+audio DiT, its
step-execution contract (see docs/model.md) and its serving rooms.

Rooms, dependencies pointing down: serving -> diffusion -> model; inputs and weights -> model;
parallel -> diffusion, weights, model; factory (load_engine) is the one module that puts
diffusion, weights and parallel together, and demo sits on top. config, rules and media are below
them all. The core (model, diffusion, inputs, weights) imports no wire module (protocol,
request_model) and nothing of Triton, and raises its own errors (rules.InvalidRequest); serving/
has a room per model (dit, vae, encoder) and one they share (shared, with the python models'
Triton helpers), and words the core's errors for the wire (tests/test_imports.py checks this)."""
