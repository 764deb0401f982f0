# The two set-up commands of the README: `make demo` and `make test`. Each installs what it
# needs into .venv: the demo the package with its `embedded` extra alone, the tests the `test`
# extra too.
PYTHON ?= python3
VENV := .venv
DEMO_INSTALL := -e '.[embedded]'
TEST_INSTALL := -e '.[test,embedded]'

.PHONY: demo test lint docs bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet $(DEMO_INSTALL)
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install --quiet $(TEST_INSTALL)
	touch $@

demo: $(VENV)/.installed-demo
	$(VENV)/bin/worker demo

test: $(VENV)/.installed-test
	$(VENV)/bin/python -m pytest -n auto -q

docs: $(VENV)/.installed-test
	$(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check worker tests examples bench
	$(VENV)/bin/mypy worker

clean:
	rm -rf $(VENV) .worker-data .pytest_cache .mypy_cache .ruff_cache
