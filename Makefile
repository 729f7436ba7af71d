# zerosum — the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.zerosum-installed

.PHONY: demo test test-slow lint typecheck unit bench proto proto-check clean bytecode

# The project's own modules, compiled once into __pycache__ before anything starts
# processes. Where PYTHONDONTWRITEBYTECODE is set, Python never writes these files
# itself, and every coordinator and node process would compile its modules again
# (0.7 s of CPU each here); it still reads files compiled beforehand.
SOURCES := bounded coordinator node noise proto simulations zerosum benchmarks tests

# Create or reuse .venv and install the project with its development and cluster extras.
# Reinstalls only when pyproject.toml or a C source (built in place by setup.py: the
# aggregate check's tags and the keyed streams' AES words) changes. pip compiles what
# it installs on one core; installing without that and compiling the venv's packages
# afterwards on every core gives the same bytecode (needed where
# PYTHONDONTWRITEBYTECODE is set) sooner.
$(STAMP): pyproject.toml setup.py noise/_tag_sums.c noise/_keystream.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev,cluster]'
	@$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') > /dev/null
	@touch $(STAMP)

demo: $(STAMP) bytecode
	$(BIN)/zerosum demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers: the modules that run sessions of real processes one at a time on one,
# every other module on whichever is free (tests/support/scheduling.py). Coverage
# (of noise/ and bounded/) is measured over their own unit tests; the rest runs
# without the tracer, which made sessions run in the test process ~45 % slower.
COVERED := tests/noise tests/proto
unit: $(STAMP) bytecode
	$(BIN)/pytest -n 2 $(COVERED)
	$(BIN)/coverage report --include='noise/*' --fail-under=95
	$(BIN)/pytest -n 2 --no-cov $(addprefix --ignore=,$(COVERED))

test: lint typecheck unit

# The slow tests (pytest -m slow): the robustness campaign of tests/campaign/
# (1,000 fuzzed messages per RPC, sessions through a faulty network, a full
# disk, crashes at every stage, 50 nodes x 20 rounds) and the other slow tests.
test-slow: $(STAMP) bytecode
	$(BIN)/pytest -m slow --no-cov -p no:cacheprovider

bench: $(STAMP) bytecode
	$(BIN)/python -m benchmarks --out bench.json

bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 $(SOURCES) > /dev/null

proto: $(STAMP)
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage bench.json
	find $(SOURCES) -name __pycache__ -type d -prune -exec rm -rf {} +
