# bppo_kit: the user-facing commands. `make demo` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast export check-export lessons pytest docs sft eval clean

install: $(STAMP)  ## create .venv, install the pinned CPU torch first, then the kit with its dev extras

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

demo: install  ## the main job on the embedded default: a short GRPO run of the shipped tiny policy on CPU
	$(BIN)/bppo train --preset cpu-demo --algo grpo --steps 40 --out runs/demo --overwrite

test: install check-export lessons pytest  ## export check, every lesson, every test

check-export: install  ## the committed bppo_kit/ must equal a fresh nbdev-export of nbs/
	$(BIN)/python tools/check_export.py

lessons: install  ## run every lesson notebook as a test (gpu and slow cells skipped)
	$(BIN)/nbdev-test --n-workers 1 --timing

pytest: install
	$(BIN)/python -m pytest -q tests

export: install
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

docs: install  ## render lessons and tutorials into docs/ (Quarto's nbdev-docs when quarto is installed)
	@if command -v quarto >/dev/null 2>&1; then $(BIN)/nbdev-docs; else $(BIN)/python tools/build_docs.py; fi

sft: install  ## retrain the shipped tiny policy into data/tiny_policy (about 10 minutes on 2 cores)
	$(BIN)/bppo sft --preset tiny

eval: install  ## the shipped policy's numbers, as quoted in the README
	$(BIN)/bppo eval --preset cpu-demo --samples 8 --json runs/eval_tiny.json

clean:
	rm -rf runs docs/*.html _proc .pytest_cache
