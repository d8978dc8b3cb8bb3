PY := .venv/bin/python
PROMPT ?= a red ball rolls to the left while a low tone plays on the left
# make serve-gpu: the DiT config, its checkpoint folder (without CHECKPOINT, seeded random weights
# of CONFIG are drawn into checkpoints/CONFIG on the GPU once: bench 12 GB in seconds) and a text
# encoder of the config's text width: ENCODER when given; without CHECKPOINT, the weight-free
# benchmark encoder of width 5120 that bench and h3 read, written once (its states carry no
# meaning); with an official checkpoint, its own Qwen3-VL text_encoder/
CONFIG ?= bench
BENCH_ENCODER := $(CURDIR)/checkpoints/bench_text_encoder
ENCODER ?= $(if $(CHECKPOINT),,$(BENCH_ENCODER))

.PHONY: setup test test-gpu demo serve serve-demo serve-api serve-gpu

setup:
	bash scripts/setup.sh

# make test's pytest processes (pytest-xdist; each test file whole on one): the 2-core CI machine's count
TEST_WORKERS ?= 2

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -rfEs -n $(TEST_WORKERS) --dist loadfile tests

# the CUDA tests (tests/test_gpu.py, docs/gpu_host.md §"Testing on a GPU"): on the GPU host's own python3 unless
# PY is given, without setup; OUT=DIR also writes DIR/gpu.xml (junit) and DIR/gpu_tests.json
# (benchmarks/gpu_tests_report.py), even when a test fails (make still fails then)
test-gpu: PY = python3
test-gpu:
	$(PY) -m pytest -q -rs --log-level=INFO -m gpu tests/test_gpu.py $(if $(OUT),--junitxml=$(OUT)/gpu.xml); status=$$?; \
	$(if $(OUT),$(PY) benchmarks/gpu_tests_report.py --junit $(OUT)/gpu.xml --out $(OUT)/gpu_tests.json;) \
	exit $$status

# the trained demo model (config demo, weights/demo; docs/demo_model.md) from a repository the
# writer makes; model_repository/ itself keeps the tiny config on seeded random weights (tests, serve).
# Conditioned: FIRST_FRAME=a.png and/or LAST_FRAME=b.png (fl2va), REFERENCE_IMAGE=c.png and/or
# REFERENCE_AUDIO=d.wav (ref2va), passed to client.generate as --first-frame etc.
# LoRAs (docs/lora.md §"The demo's LoRAs"): LORA=turbo STEPS=2 (the few-step student), LORA=style:0.5, or a
# comma list; h3_dit loads both shipped adapters (--set h3_dit.loras) and the request names LORA's (--lora
# NAME[:SCALE] each); LORA empty: no adapter. STEPS=N: the request's denoise steps (default: the config's).
LORA ?=
STEPS ?=
comma := ,
DEMO_LORAS := turbo=$(CURDIR)/weights/demo/turbo_lora.safetensors,style=$(CURDIR)/weights/demo/style_lora.safetensors
demo: setup
	mkdir -p out
	$(PY) -m server.repository out/demo_model_repository --config demo --checkpoint weights/demo \
		$(if $(LORA),--set h3_dit.loras=$(DEMO_LORAS))
	$(PY) -m server.launch --free-ports --model-repository out/demo_model_repository \
		--then $(PY) -m client.generate --prompt "$(PROMPT)" --out out/demo.mp4 --wav out/demo.wav \
		$(if $(STEPS),--steps $(STEPS)) $(foreach lora,$(subst $(comma), ,$(LORA)),--lora $(lora)) \
		$(if $(FIRST_FRAME),--first-frame "$(FIRST_FRAME)") $(if $(LAST_FRAME),--last-frame "$(LAST_FRAME)") \
		$(if $(REFERENCE_IMAGE),--reference-image "$(REFERENCE_IMAGE)") \
		$(if $(REFERENCE_AUDIO),--reference-audio "$(REFERENCE_AUDIO)")

# foreground on 127.0.0.1:8000 (HTTP) / 8001 (gRPC) / 8002 (metrics); Ctrl-C stops it.
# serve: model_repository/ as shipped (tiny, seeded random weights, CPU)
serve: setup
	$(PY) -m server.launch

# the trained demo model on the CPU, from a repository written into a temporary folder
serve-demo: setup
	$(PY) -m server.launch --config demo --checkpoint weights/demo

# the Videos API front end (python -m videos_api: the page on http://127.0.0.1:$(API_PORT)/,
# OpenAI's /v1/videos) over tritonserver serving the demo model on free ports (the front end is the
# entry point; the launcher prints Triton's); Ctrl-C stops both.
# API_ARGS: more front-end flags, e.g. API_ARGS="--api-key-file keys.txt"
API_PORT ?= 8080
API_ARGS ?=
serve-api: setup
	$(PY) -m server.launch --free-ports --config demo --checkpoint weights/demo \
		--then $(PY) -m videos_api --port $(API_PORT) $(API_ARGS)

# every GPU: one DiT instance per GPU, sized from free GPU memory (server.sizing);
# make serve-gpu CONFIG=h3 CHECKPOINT=/path/to/MiniMax-H3 TRUST_REMOTE_CODE=true for the official
# checkpoint (its VAEs are remote code: docs/gpu_host.md §"Serving the official MiniMax-H3 checkpoint")
serve-gpu: setup
ifeq ($(CHECKPOINT),)
	$(PY) -m h3_core.weights.checkpoint_setup --configs $(CONFIG) --device cuda
endif
ifeq ($(ENCODER),$(BENCH_ENCODER))
	test -f $(ENCODER)/model.safetensors || $(PY) benchmarks/bench_text_encoder.py $(ENCODER) --width 5120
endif
	$(PY) -m server.launch --device cuda --gpus all --config $(CONFIG) \
		--checkpoint $(or $(CHECKPOINT),checkpoints/$(CONFIG)) \
		$(if $(ENCODER),--set h3_encoder.encoder_path=$(ENCODER)) \
		$(if $(TRUST_REMOTE_CODE),--set h3_vae.trust_remote_code=$(TRUST_REMOTE_CODE))
