"""Serving: a room per model and one for what they share. dit/ (h3_dit's step loop,
its arrivals, packed step, events, metrics, the scheduler and its simulator), vae/ (h3_vae's
decode pool, open decodes, gone clients), encoder/ (h3_encoder's conditioning work) and shared/
(the registry, GPU turns, the settings, the Triton helpers of the python models). A room imports
shared/, the core and the wire modules (protocol, request_model), never another room
(tests/test_imports.py)."""
