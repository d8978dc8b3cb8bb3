PY := .venv/bin/python
PROMPT ?= a red ball rolls to the left while a low tone plays on the left

.PHONY: setup test demo serve

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q tests

demo: setup
	mkdir -p out
	$(PY) -m server.launch --free-ports --then $(PY) -m client.generate --prompt "$(PROMPT)" --out out/demo.mp4

# foreground on 127.0.0.1:8000 (HTTP) / 8001 (gRPC) / 8002 (metrics); Ctrl-C stops it
serve: setup
	$(PY) -m server.launch
