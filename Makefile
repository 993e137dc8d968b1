# The README's quickstart: `make demo` runs the main job, `make test` runs the tests.
# Both create/update the local virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.vlmcp-installed

.PHONY: demo test lint bench-plan clean

$(STAMP): pyproject.toml requirements/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/cpu.txt
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m vlmcp plan

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check vlmcp tests benchmarks

bench-plan: $(STAMP)
	$(PY) benchmarks/plan_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
