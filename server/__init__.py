"""The launcher: the CLI (server.launch), finding and preparing tritonserver
(server.environment), the server process (server.process: TritonServer, metrics, supervision),
reading its /metrics (server.metrics), the model-repository writer (server.repository; its plan:
server.planner, placing the models: server.placement, h3_dit's rows per GPU: server.gpu_rows, the
config.pbtxt texts: server.config_texts; what it sizes from the machine: server.sizing; its
options, shared with the launcher: server.options) and the container health check
(server.health). The python models' Triton helpers live beside them (h3_core.serving.shared.triton),
the Videos API in its own package (videos_api)."""
