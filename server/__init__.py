"""Serving glue: the launcher CLI (server.launch), finding and preparing tritonserver
(server.environment), the server process (server.process: TritonServer, metrics, supervision),
reading its /metrics (server.metrics), the model-repository writer (server.repository; its plan:
server.planner, placing the models: server.placement, h3_dit's rows per GPU: server.gpu_rows, the
config.pbtxt texts: server.config_texts; what it sizes from the machine: server.sizing; its
options, shared with the launcher: server.options), the container health check
(server.health) and the python models' Triton helpers (server.adapter)."""
