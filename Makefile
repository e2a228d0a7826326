# qwenctxd — developer entry points. `make install && make run`; `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test e2e bench reliability lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "qwenctxd needs Python 3.11+ (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	@touch $(STAMP)

# The daemon in the foreground; logs on stderr (console on a terminal, JSON otherwise).
run: install
	$(BIN)/qwenctxd

# The whole suite, in two pytest-xdist workers (a test file stays on one worker, so module-scoped
# daemons are shared as written; TEST_WORKERS=0 runs it in one process). pytest's exit 5 ("no
# tests ran") is a failure here, never a pass.
TEST_WORKERS ?= 2
test: install
	@$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --ignore=tests/e2e; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests ran — failing"; exit 1; fi; exit $$rc

# Real counterparts: a llama.cpp server and the real Qwen Code CLI. tests/e2e/prepare.sh fills
# the cache (~/.cache/qwenctxd-e2e or $$QWENCTXD_E2E_CACHE) only where it is empty.
e2e: install
	PYTHON=$(PYTHON) bash tests/e2e/prepare.sh
	@$(BIN)/python -m pytest -q tests/e2e; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make e2e: no tests ran — failing"; exit 1; fi; exit $$rc

bench: install
	$(BIN)/python -m bench

# One benchmark of `make bench`: kill -9 under load, and RSS over a long run (bench/reliability.py).
reliability: install
	$(BIN)/python -m bench reliability

lint: install
	$(BIN)/ruff check qwenctxd clients tests bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
