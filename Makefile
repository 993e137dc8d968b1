# The README's quickstart: `make demo` runs the main job, `make test` runs the tests.
# Both create/update the local virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vlmcp-installed

.PHONY: demo test install-check lint bench bench-plan clean compat compat-lowest

# requirements/ci.txt pins every package CI tests with (pip constraints), so a new release of
# transformers (or anything else) cannot change what `make test` installs.
$(STAMP): pyproject.toml requirements/cpu.txt requirements/ci.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/cpu.txt
	$(PY) -m pip install -q -c requirements/ci.txt -e '.[test]'
	touch $(STAMP)

# The main job on its built-in default: train the reference VLM with CP=2 on the built-in
# data (loss curve and checkpoints under runs/demo), check CP gradients against one process,
# and draw the layout of a packed row.
demo: $(STAMP)
	rm -rf runs/demo
	$(PY) -m vlmcp train --cp 2 --metrics-jsonl runs/demo/metrics.jsonl --checkpoint-dir runs/demo/checkpoints --checkpoint-every 20
	$(PY) -m vlmcp verify --cp 2
	$(PY) -m vlmcp plan --out runs/demo/plan.png

test: $(STAMP)
	$(PY) -m pytest -q

# Only the install check, which `make test` runs too: a fresh venv with the pinned CPU torch
# and vlmcp without extras must run `vlmcp train --metrics-jsonl` and `vlmcp plan --out`.
install-check: $(STAMP)
	$(PY) -m pytest -q -m install

# The suite against the registry's newest transformers, peft, trl and accelerate (their own venv,
# .venv-compat-newest; the upper bounds ignored): the check to run on the day a release comes out.
compat:
	$(PYTHON) scripts/compat.py newest

# The suite against the lowest releases of the tested ranges (requirements/lowest.txt).
compat-lowest:
	$(PYTHON) scripts/compat.py lowest

lint: $(STAMP)
	$(PY) -m ruff check vlmcp tests

bench-plan: $(STAMP)
	$(PY) -m vlmcp bench plan

# Every figure of docs/benchmarks.md's "Measured" section (minutes; not part of the tests).
bench: $(STAMP)
	$(PY) -m vlmcp bench all
	$(PY) -m vlmcp compare --out runs/compare.md

# On a machine with CUDA (minutes): the GPU-marked tests (every CUDA kernel against the math
# kernel, NCCL ring/Ulysses parity through torchrun on all local GPUs) and the attention
# benchmark on CUDA, then a short report. Runs GPU_PYTHON, an environment with a CUDA build
# of torch and `pip install -e '.[test]'` (not .venv, which holds the CPU wheel).
GPU_PYTHON ?= python3
.PHONY: gpu-check gpu-bench
gpu-check:
	$(GPU_PYTHON) scripts/gpu_check.py

# On one GPU (at most about 8 minutes): kernel parity against the CPU path, tokens/s and MFU of a
# whole HF step on a Qwen2.5-VL-3B-shaped random model at 8k/32k/64k tokens, and the step's
# max_memory_allocated against vlmcp plan --model (docs/gpu.md). Exits 2 without CUDA.
gpu-bench:
	$(GPU_PYTHON) scripts/gpu_bench.py

clean:
	rm -rf $(VENV) .venv-compat-newest .venv-compat-lowest build *.egg-info
