# Two commands for a newcomer (see README):
#   make demo   install the package alone (no test extras), migrate the bundled zarr-python 2.18
#               sample, verify it; prints only the demo's output (the install's is in .venv/install.log)
#   make test   install everything (incl. the zarr 2.18 oracle venv), lint, and run the whole suite
#   make check  the fast loop: lint (ruff, mypy) and the tests not marked slow (under 2 minutes)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the package alone (what the demo runs): `make test` adds the test and bench extras on top
BASE   := $(VENV)/.installed-base
SAMPLE := samples/zarr-2.18-sharded.zr3
OUT    := demo-out/sample-v3.zarr
# tests' temporary files: one folder of ours, emptied by rm -rf before each run (pytest's own
# clean-up of old numbered folders recurses per level and fails on a tree deeper than 1000)
TESTTMP := .pytest-tmp

.PHONY: install demo test check lint bench legacy clean

# compiled modules are kept (in __pycache__, ignored by git) even where the environment says
# PYTHONDONTWRITEBYTECODE: else every run compiles the package again in each test's child
# process and pytest rewrites the asserts of every test module again in each worker
# (about 8 s of CPU per worker, a quarter of the fast loop's time on two cores)
check test lint: export PYTHONDONTWRITEBYTECODE :=

$(BASE): setup.cfg setup.py pyproject.toml sharding_store/codec/_loops.c
	@$(PYTHON) -m venv $(VENV)
	@echo "== installing sharding-store into $(VENV) (output in $(VENV)/install.log)"
	@$(PY) -m pip install --quiet -e . > $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@touch $(BASE)

$(STAMP): $(BASE)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

legacy:
	bash compat/setup_legacy.sh
	bash compat/setup_zarrita.sh || test $$? -eq 3  # 3: no Python 3.11, its tests skip saying so

demo: $(BASE)
	@echo "== what is in the sample (written by zarr-python 2.18 with the draft sharding transformer)"
	@$(VENV)/bin/sharding-store info $(SAMPLE)
	@echo "== migrate it to Zarr v3 + sharding_indexed (payloads copied verbatim, then verified)"
	@$(VENV)/bin/sharding-store migrate $(SAMPLE) $(OUT) --overwrite
	@echo "== verify again, independently"
	@$(VENV)/bin/sharding-store verify $(SAMPLE) $(OUT)
	@echo "== open the result with zarr-python 3 and compare with the source"
	@$(PY) examples/open_migrated.py $(SAMPLE) $(OUT)
	@echo "== the sharding-store command is in $(VENV)/bin: 'source $(VENV)/bin/activate' puts it on PATH"
	@echo "   (or call $(CURDIR)/$(VENV)/bin/sharding-store, or '$(PY) -m sharding_store')"

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

# the fast loop: lint, then every test not marked slow (no oracle venvs, no S3 server,
# no killed processes, no dask clusters, no installs, not the heaviest property tests);
# `make test` runs everything (tests/test_package.py checks both)
check: lint
	rm -rf $(TESTTMP)
	$(PY) -m pytest -n 2 --dist loadfile -q -m "not slow" -p no:cacheprovider --basetemp=$(TESTTMP)

test: install legacy lint
	rm -rf $(TESTTMP)
	$(PY) -m pytest -n 2 --dist loadfile -q --basetemp=$(TESTTMP)

bench: install legacy
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) compat/.venv-legacy compat/.corpus compat/.venv-zarrita compat/.corpus-zarrita demo-out
