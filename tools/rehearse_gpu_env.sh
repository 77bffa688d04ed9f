#!/usr/bin/env bash
# `make rehearse-gpu-env`: the GPU host's Python rebuilt on this CPU, then G1 run on the smoke profile through the
# same script and bundle the GPU run uses. Not part of `make test` (it installs torch 2.11, several GB).
# `make rehearse-gpu-env GROUPS="G5a G5b"` rehearses those groups instead; GROUPS=all rehearses every group of the
# plan (about 25 minutes on 2 cores), so a lease never meets a notebook that fails on the host's torch.
#
# The stand-in for the host's image: Python 3.12, torch==2.11.0 (PyPI's build: CUDA 13.0 libraries, run here on
# the CPU), and the image's own versions of the packages the bundle shadows (transformers 5.17, huggingface_hub
# 1.33, tokenizers 0.23.2, sentencepiece 0.2.2, numpy 2.5.2; device tool's package list, read 2026-11-17), plus
# the compiled packages the bundle leaves to the image. pandas is taken below 3 on purpose: the image's pandas
# version is not recorded, so the rehearsal checks the older major. Then the bundle is installed exactly as on
# the host (pip --no-index --no-deps --target) and shadows the image's copies through PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-gpu
PY312=${PY312:-$(command -v python3.12 || true)}
if [ -n "$PY312" ] && ! "$PY312" -c "" 2>/dev/null; then PY312=""; fi  # a pyenv shim without 3.12 selected
if [ -z "$PY312" ]; then  # pyenv's own 3.12, when no python3.12 is on PATH
  PY312=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
fi
if [ -z "$PY312" ]; then
  echo "rehearse-gpu-env: needs python3.12 (the GPU host's Python); set PY312=/path/to/python3.12" >&2; exit 2
fi
if [ ! -f $VENV/.image-installed ]; then
  rm -rf $VENV
  "$PY312" -m venv $VENV
  $VENV/bin/python -m pip install -q --upgrade pip
  $VENV/bin/python -m pip install -q torch==2.11.0 numpy==2.5.2 "pandas<3" transformers==5.17.0 \
    huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 sentencepiece==0.2.2 accelerate==1.15.0 peft \
    matplotlib pillow psutil pyyaml regex requests jinja2 aiohttp attrs click pygments packaging
  touch $VENV/.image-installed
fi
# Neither torchmetrics nor scikit-learn is in the bundle (tools/gpu_bundle.py) or on the host: helpers.quality judges
# digits (G0 runs the trained smoke model on the GPU) with plain torch and the shipped judge files, so the rehearsal
# must not have them either: a notebook that imports one fails here as it would there.
$VENV/bin/python -m pip uninstall -q -y torchmetrics scikit-learn 2>/dev/null || true
$VENV/bin/python -c "import torch; print('rehearsal python', __import__('sys').version.split()[0], 'torch', torch.__version__)"
rm -rf build/rehearsal build/rehearsal-site build/rehearsal-site-kernels
GROUPS=${GROUPS:-G1}
if [ "$GROUPS" = all ]; then
  GROUPS=$($VENV/bin/python -c "from helpers.gpu_run import GROUPS; print(' '.join(GROUPS))")
fi
failed=""
for group in $GROUPS; do  # every group runs, so one failure does not hide the next
  start=$(date +%s)
  if PYTHON=$VENV/bin/python bash tools/gpu_run.sh "$group" build/rehearsal --profile smoke --budget 3000 \
      --site "$PWD/build/rehearsal-site"; then
    echo "rehearse-gpu-env: $group on the smoke profile passed on torch 2.11 in $(( $(date +%s) - start )) s;" \
      "executed notebooks and rows in build/rehearsal/$group.tar.gz"
  else
    failed="$failed $group"
    echo "rehearse-gpu-env: $group FAILED on torch 2.11 (build/rehearsal/$group.log, $group.tar.gz)" >&2
  fi
done
[ -z "$failed" ] || { echo "rehearse-gpu-env: failed:$failed" >&2; exit 1; }
