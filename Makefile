# Two commands on a fresh machine with Python 3.11+:  `make up`  and  `make test`.
# Each bootstraps a local virtualenv (.venv) with this package installed.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install up test bench clean

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("a2m-router needs Python 3.11+, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

install: $(VENV)/.installed

up: install
	$(VENV)/bin/a2m up $(ARGS)

test: install
	$(PY) -m pytest -n 2 --dist loadfile

bench: install
	$(VENV)/bin/a2m bench --quick

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
