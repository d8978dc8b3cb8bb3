"""The DiT's serving loop, Triton-free: the step loop (step_loop) with its events, admission and
metrics, the scheduler and its policies, the registry shared by DiT instances, the models'
settings, the decode pool and the scheduling simulator. Imports diffusion/ and model/, never
weights/ or parallel/."""
