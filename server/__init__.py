"""Serving glue: the launcher CLI (server.launch), finding and preparing tritonserver
(server.environment), the server process (server.process: TritonServer, metrics, supervision),
the model-repository writer (server.repository) and the python models' Triton helpers
(server.adapter)."""
