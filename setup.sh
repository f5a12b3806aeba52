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
