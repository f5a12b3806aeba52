#!/usr/bin/env bash
# Set up k3c on a fresh machine: a virtualenv in .venv with the pinned toolchain and k3c
# installed editable with its test extra. Safe to run again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and pinned: the CPU wheel. A bare `torch` requirement would pull a CUDA build.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
# onnxruntime: the GPU wheel of the same version where an NVIDIA driver answers (its CUDA
# execution provider: k3c.compile(..., providers=["CUDAExecutionProvider"])), the CPU wheel
# elsewhere. Both install the module `onnxruntime`, so the CPU one goes first, and the GPU one
# is reinstalled on every run (the line above puts the CPU wheel's files back over it).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ORT_VERSION=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('onnxruntime'))")
  .venv/bin/python -m pip uninstall -q -y onnxruntime
  .venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    "onnxruntime-gpu==$ORT_VERSION"
fi
