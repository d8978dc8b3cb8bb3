"""Serving glue: server.launch (tritonserver launcher) and server.adapter (python-model helpers)."""
