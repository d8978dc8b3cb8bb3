"""Serving glue: the launcher CLI (server.launch), finding and preparing tritonserver
(server.environment), the server process (server.process: TritonServer, metrics, supervision),
the model-repository writer (server.repository; what it sizes from the machine: server.sizing;
its options, shared with the launcher: server.options), the container health check
(server.health) and the python models' Triton helpers (h3_core.serving.shared.triton)."""
