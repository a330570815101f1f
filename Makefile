# One entry point for people and CI. `make run` and `make test` install
# everything they need first (a virtualenv in $(VENV), the Rust binaries).

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: install native ivy run test test-rust test-python bench lint clean

## install: virtualenv with torch and test tools, the Tulip extension, Ivy
install: $(VENV)/.deps native ivy

# Third-party Python packages: installed once, reused while pyproject.toml
# is unchanged (torch is large; an existing virtualenv is never rebuilt).
$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $@

## native: (re)build the Tulip extension module into the source tree
native: $(VENV)/.deps
	$(PIP) install -q -e . --no-deps --no-build-isolation

## ivy: the gateway binary (target/release/ivy)
ivy:
	$(CARGO) build --release -p ivy

## run: Ivy + one Tulip replica on the embedded default model
run: install
	VENV=$(VENV) ./deploy/run_local.sh

## test: every Rust and Python test
test: install test-rust test-python

test-rust:
	$(CARGO) test --release --workspace

test-python:
	$(PY) -m pytest -q tests

clean:
	rm -rf target build $(VENV)
