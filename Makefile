# One entry point for people and CI. `make run` and `make test` install
# everything they need first (a virtualenv in $(VENV), the Rust binaries).

VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# `python -m pip`: a virtualenv copied or moved (a CI cache) still installs
# into itself, where bin/pip's shebang would name the old path.
PIP := $(PY) -m pip
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: install native ivy wheels images images-smoke run test test-rust test-python bench infinity lint clean gpu-bundle

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

## ivy: the gateway binary, optimised as shipped (target/dist/ivy)
ivy:
	$(CARGO) build --profile dist -p ivy

## wheels: dist/ gets the tulip-rose wheel (Tulip's extension as abi3, ROSE,
## the CLI) and tulip-rose-ivy (the Ivy binary, packaging/ivy, stripped);
## installing both (`tulip-rose[ivy]`) needs no Rust toolchain (docs/serve.md)
wheels: $(VENV)/.deps
	PYTHON=$(PY) packaging/wheels.sh dist

## images: the Ivy image and the Tulip image (VARIANTS, default cpu) with
## buildah, on local stand-ins for base images that cannot be pulled
## (deploy/README.md, "Building without Docker"); niced, it is long
images:
	nice deploy/images/build.sh

## images-smoke: runs the built images' entrypoints (Ivy in front of Tulip,
## then `tulip-rose serve` in the Tulip image) and embeds through them
images-smoke: $(VENV)/.deps
	PYTHON=$(PY) deploy/images/smoke.sh

## run: `tulip-rose serve` on the embedded default model (one Tulip replica
## per GPU, or one on the CPU, behind Ivy); ARGS="--model ..." adds flags
# exec: the shell make starts is replaced, so a signal sent to make's child
# reaches `serve` (which drains) rather than a shell that would leave it running.
run: install
	VENV=$(VENV) exec ./deploy/run_local.sh $(ARGS)

## test: every Rust and Python test
test: install test-rust test-python

test-rust:
	$(CARGO) test --release --workspace
	# The compiled load generator (its dependencies are built by the tests
	# above): the simulated-device dry run times and profiles with it.
	$(CARGO) build --release -p loadgen
	# The Rust side of `python -m bench image-prep` (tests/bench/test_image_prep.py).
	$(CARGO) build --release -p ivy-imageprep --example prep_rate

test-python:
	$(PY) -m pytest -q tests

## lint: the gates that read the code (CI runs them, .ci/run): rustfmt,
## clippy with every warning an error (the workspace lints in Cargo.toml),
## ruff (pyflakes, import order, bugbear; pyproject.toml), mypy on the
## shipped Python packages, no import cycle in any Rust crate or between the
## Python packages, the architecture trees, every test asserting something
lint: $(VENV)/.deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q tests/test_import_cycles.py tests/test_architecture.py tests/test_every_test_asserts.py

## bench: the CPU benchmark suite with its in-run baselines (bench/README.md);
## writes bench/results/<date>-<machine>/. Infinity is optional: without it
## its rows say why.
bench: install $(VENV)/.bench-deps
	-$(MAKE) infinity
	$(PY) -m bench cpu

$(VENV)/.bench-deps: pyproject.toml $(VENV)/.deps
	$(PIP) install -q -e '.[bench]'
	touch $@

# Infinity pins transformers<5, sentence-transformers<4 and numpy<2, so it
# gets its own virtualenv; it reuses our torch (several GB) through a .pth
# file, and its own pins shadow ours there.
INFINITY_VENV ?= .venv-infinity
INFINITY_VERSION ?= 0.0.78

## infinity: Infinity (the baseline server) in $(INFINITY_VENV)
infinity: $(INFINITY_VENV)/.deps

$(INFINITY_VENV)/.deps: $(VENV)/.deps
	test -x $(INFINITY_VENV)/bin/python || $(PY) -m venv $(INFINITY_VENV)
	site=$$($(INFINITY_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	$(PY) -c 'import os, sys; print("\n".join(os.path.abspath(p) for p in sys.path if p.endswith("-packages")))' \
		> "$$site/_base_venv.pth"
	$(INFINITY_VENV)/bin/pip install -q 'infinity-emb[server,torch]==$(INFINITY_VERSION)'
	touch $@

## gpu-bundle: what travels to a GPU machine besides the tracked tree, built
## and stripped into gpu-bundle/ (size printed and checked; bench/gpu/README.md)
gpu-bundle: $(VENV)/.deps
	PYTHON=$(PY) CARGO=$(CARGO) bench/gpu/bundle.sh gpu-bundle

clean:
	rm -rf target build $(VENV) $(INFINITY_VENV) gpu-bundle
