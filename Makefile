# Every target sets itself up on a fresh machine that has Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PORT   ?= 8888

.PHONY: venv test test-fast reproduce lab browser clean-venv

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fast-diffusion)"
	touch $(STAMP)

## make test: helper unit tests, every notebook on the smoke profile (papermill), hygiene, browser test
test: venv
	$(PY) -m pytest tests

## make test-fast: everything except the notebook and browser runs
test-fast: venv
	$(PY) -m pytest tests -m "not notebook and not browser"

## make reproduce: run every notebook (full profile on a big enough GPU, else smoke), then the report
reproduce: venv
	$(PY) -m helpers.reproduce

## make lab: JupyterLab on the notebooks, with the project's kernel
lab: venv
	$(PY) -m jupyter lab --notebook-dir=notebooks --port=$(PORT)

clean-venv:
	rm -rf $(VENV)
