"""A manifest is data: its dims are parsed by k3c's bounded parser, never evaluated. The ONNX
runner used to hand them to sympify: an input dim `T+__import__('os').system(...)` ran the
command when prefill was called, and `10**10**10` hung for over 600 s."""

from __future__ import annotations

import time

import pytest
import torch
from security_testlib import T, edit_manifest, manifest, write_manifest

import k3c
from k3c.errors import ArtifactError, ManifestError


def _load_and_prefill(backend: str, out):
    runner = k3c.backends.get(backend).load(out)
    return runner.run("prefill", torch.zeros(1, T, dtype=torch.long), torch.tensor([T]))


def _set_dim(m: dict, text: str) -> None:
    m["entries"]["prefill"]["inputs"][0]["shape"][1] = text


@pytest.mark.parametrize("backend", ["onnx", "tvm"])
def test_a_dim_that_runs_code_is_refused_before_anything_runs(fresh, tmp_path, backend):
    out, _ = fresh(backend)
    marker = tmp_path / "ran"
    edit_manifest(out, lambda m: _set_dim(m, f"T+__import__('os').system('touch {marker}')"))
    with pytest.raises(ManifestError, match=r"entries\.prefill\.inputs\[0\]\.shape\[1\]"):
        _load_and_prefill(backend, out)
    assert not marker.exists()


@pytest.mark.parametrize("backend", ["onnx", "tvm"])
@pytest.mark.parametrize("text", ["10**10**10", "((((T**8)**8)**8)**8)", "(B+T+1)**8*(B+T+2)**8*(B+T+3)**8"])
def test_a_dim_that_would_hang_is_refused_at_once(fresh, backend, text):
    out, _ = fresh(backend)
    edit_manifest(out, lambda m: _set_dim(m, text))
    start = time.perf_counter()
    with pytest.raises(ManifestError, match="shape"):
        _load_and_prefill(backend, out)
    assert time.perf_counter() - start < 1.0


def test_a_format_version_this_k3c_does_not_know_is_refused(fresh):
    out, _ = fresh("onnx")
    edit_manifest(out, lambda m: m.update(format_version=99))
    with pytest.raises(ManifestError, match="format_version"):
        _load_and_prefill("onnx", out)


@pytest.mark.parametrize("backend", ["reference", "onnx", "tvm", "triton"])
@pytest.mark.parametrize("shape", ["a list", "a string", "entries", "artifact", "files entry"])
def test_a_manifest_of_another_shape_is_one_artifact_error(fresh, backend, shape):
    out, _ = fresh(backend)
    m = manifest(out)
    if shape == "a list":
        m = [m]
    elif shape == "a string":
        m = "manifest"
    elif shape == "files entry":
        m["files"][next(iter(m["files"]))] = "0 bytes"
    else:
        m[shape] = "a string where an object belongs"
    write_manifest(out, m)
    with pytest.raises(ArtifactError) as err:
        _load_and_prefill(backend, out)
    assert "\n" not in str(err.value)
    if shape in ("artifact", "files entry"):
        assert isinstance(err.value, ManifestError) and "field" in str(err.value)
