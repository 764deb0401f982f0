# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv

.PHONY: demo test lint docs bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,embedded]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/worker demo

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -n auto -q

docs: $(VENV)/.installed
	$(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check worker tests examples bench
	$(VENV)/bin/mypy worker

clean:
	rm -rf $(VENV) .worker-data .pytest_cache .mypy_cache .ruff_cache
