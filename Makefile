# Every target sets itself up on a fresh machine that has Python 3.11 and the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PORT   ?= 8888

.PHONY: venv test test-all test-fast test-matrix train-smoke reproduce lab browser browser-deps clean-venv gpu-bundle gpu-aside gpu-back rehearse-gpu-env

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile --no-deps --no-build-isolation -e .  # torch brings setuptools: no build venv
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fast-diffusion)"
	env -u PYTHONDONTWRITEBYTECODE $(PY) tools/warm_bytecode.py
	touch $(STAMP)

## make test: helper unit tests, every notebook once on the smoke profile (papermill), hygiene, browser test;
## TEST_WORKERS pytest processes share the test files (pytest-xdist; a notebook run keeps about one core busy, so 2 on
## 2 cores; bytecode writing on, so a module a test imports first is compiled once, not in every process).
## make test-all adds the tests marked slow: second runs of a notebook at MODEL="sdxl", on a planted smaller card, 12
## with every lever, 05, 06 and 10 on inductor (CONTRIBUTING.md lists them)
TEST_WORKERS ?= 2
test: venv browser-deps
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest tests -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=15

test-all: venv browser-deps
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=15

## make test-fast: everything except the notebook and browser runs
test-fast: venv
	$(PY) -m pytest tests -m "not notebook and not browser"

## make test-matrix: every notebook on the smoke profile over seeds 0-4, MODEL=sdxl and each DTYPE, as a table of
## ok / failed / refused in the setup cell (hours on a 2-core CPU, so not part of make test). MATRIX_ARGS passes
## options: `make test-matrix MATRIX_ARGS="--only 02,10 --seeds 0-9 --axes seeds,dtype --jobs 2 --out matrix.md"`
MATRIX_ARGS ?=
test-matrix: venv
	$(PY) tools/test_matrix.py $(MATRIX_ARGS)

## make train-smoke: train the smoke profile's Flux on scikit-learn's digits (about 10 minutes on 2 CPU cores):
## writes data/models/flux-dev-smoke/ (FluxPipeline.save_pretrained, train-log.txt, README.md model card) and
## data/models/digit-classifier/ (helpers.quality's judge). Not part of make test.
train-smoke: venv
	$(PY) tools/train_smoke.py

## make reproduce: run every notebook (full profile on a big enough GPU, else smoke), then the report
reproduce: venv
	$(PY) -m helpers.reproduce

## make gpu-bundle: .whl/, the pinned wheels the GPU host lacks (Python 3.12, x86-64, < 40 MiB), with its
## MANIFEST.txt and REVISION (the commit the host's rows will name). Run it before every GPU call.
gpu-bundle: venv
	$(PY) tools/gpu_bundle.py
	-$(PY) tools/gpu_tree.py size

## make gpu-aside / gpu-back: the executed notebook copies under data/ moved out of the tree before a lease (the
## device tool copies at most 64 MiB, tree and .whl/ together) and put back after it, before merging its archives.
gpu-aside:
	$(PY) tools/gpu_tree.py aside

gpu-back:
	$(PY) tools/gpu_tree.py back

## make rehearse-gpu-env: the GPU host's environment (Python 3.12, torch 2.11 + the bundle) rebuilt on this CPU,
## then group G1 run through tools/gpu_run.sh on the smoke profile (GROUPS="G5a G5b" or GROUPS=all for others).
## Must pass before a GPU run; not in make test.
rehearse-gpu-env: gpu-bundle
	GROUPS="$(GROUPS)" bash tools/rehearse_gpu_env.sh

## make lab: JupyterLab on the notebooks, with the project's kernel (python3, registered in .venv by venv);
## `-m jupyterlab` so it is .venv's JupyterLab, not a jupyter-lab found first on PATH; as root, --allow-root.
## LAB_ARGS passes more options (the browser test starts it this way: `make lab PORT=... LAB_ARGS=--no-browser`)
LAB_ARGS ?=
lab: venv
	JUPYTER_PREFER_ENV_PATH=1 $(PY) -m jupyterlab --notebook-dir=notebooks --port=$(PORT) \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

## make browser-deps: Chromium for the browser test (Debian's package, not Playwright's download);
## installs only when none is found, and only as root with apt-get; otherwise says so, and the test skips
CHROMIUM_APT := chromium fonts-liberation fonts-dejavu-core
browser-deps:
	@if { [ -n "$$CHROMIUM" ] && [ -x "$$CHROMIUM" ]; } || [ -x /usr/bin/chromium ] \
		|| command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "browser-deps: chromium found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "browser-deps: installing $(CHROMIUM_APT) with apt-get"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			-o DPkg::Lock::Timeout=120 $(CHROMIUM_APT) >/dev/null; } \
		|| echo "browser-deps: WARNING: apt-get could not install chromium; the browser test will skip"; \
	else \
		echo "browser-deps: no chromium, and no root with apt-get to install it: the browser test will skip" \
			"(run 'sudo make browser-deps', or set CHROMIUM=/path/to/chromium)"; \
	fi

clean-venv:
	rm -rf $(VENV)
