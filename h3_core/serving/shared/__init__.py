"""What the models share across processes: the registry of ids, cancels and DiT loads (registry,
SQLite), turns on one GPU between DiT steps and decode tiles (gpu_turns), every model's
config.pbtxt settings (settings), their agreement across models (agreement) and the Triton
helpers the python models share (triton). Imports no model's room."""
