"""No lost artifact: an artifact is built beside its folder and moved into place when complete,
an artifact of something else is not replaced without force, every file has a checksum that
load verifies (a truncated TVM lib.so is an error, not a SIGBUS), and diff/bench remove their
temporary folders."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest
import torch

import k3c
from k3c import backends
from k3c.backends import artifact
from k3c.backends.reference import ReferenceBackend
from k3c.errors import ArtifactError, UsageError


def _ids():
    return torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def gpt2():
    return k3c.models.build("gpt2-tiny")


@pytest.fixture(scope="module")
def linear():
    return k3c.models.build("linear-attn-tiny")


def _model_of(out) -> str:
    return json.loads((out / "manifest.json").read_text())["artifact"]["model"]


def test_another_models_artifact_is_not_replaced_without_force(tmp_path, gpt2, linear):
    out = tmp_path / "art"
    k3c.compile(gpt2, "reference", (_ids(),), out_dir=out)
    with pytest.raises(UsageError, match="holds a reference artifact of gpt2-tiny"):
        k3c.compile(linear, "reference", (_ids(),), out_dir=out)
    assert _model_of(out) == "gpt2-tiny"
    ReferenceBackend().load(out)  # still whole
    k3c.compile(linear, "reference", (_ids(),), out_dir=out, force=True)
    assert _model_of(out) == "linear-attn-tiny"


def test_compiling_the_same_model_again_replaces_its_artifact(tmp_path, gpt2):
    out = tmp_path / "art"
    k3c.compile(gpt2, "reference", (_ids(),), out_dir=out)
    run = k3c.compile(gpt2, "reference", (_ids(),), out_dir=out)
    assert run.prefill(_ids())[0].shape == (2, 16, 1024)
    assert [p.name for p in tmp_path.iterdir()] == ["art"]  # nothing left beside it


def test_other_backends_and_other_files_are_not_replaced(tmp_path, gpt2):
    onnx_dir = tmp_path / "onnx"
    k3c.compile(gpt2, "onnx", (_ids(),), out_dir=onnx_dir)
    with pytest.raises(UsageError, match="holds a onnx \\(portable\\) artifact"):
        k3c.compile(gpt2, "tvm", (_ids(),), out_dir=onnx_dir)  # refused before any build
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a k3c artifact"):
        k3c.compile(gpt2, "reference", (_ids(),), out_dir=notes)
    assert (notes / "todo.txt").read_text() == "mine"


class FailingBackend(ReferenceBackend):
    """Writes part of an artifact, then fails: the old artifact must survive whole."""

    name = "reference"

    def lower(self, graphs, out_dir, **options):
        (out_dir / "prefill").mkdir(parents=True)
        (out_dir / "prefill" / "graph.k3c").write_text("half")
        raise RuntimeError("disk full")


def test_a_write_that_fails_part_way_leaves_the_old_artifact_whole(tmp_path, gpt2):
    out = tmp_path / "art"
    k3c.compile(gpt2, "reference", (_ids(),), out_dir=out)
    graphs = k3c.compile(gpt2, "reference", (_ids(),), out_dir=tmp_path / "other").graphs
    with pytest.raises(RuntimeError, match="disk full"):
        artifact.write(FailingBackend(), graphs, out)
    runner = ReferenceBackend().load(out)  # checksums verify: the old files, every one
    assert runner.run("prefill", _ids())[0].shape == (2, 16, 1024)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art", "other"]  # no half-written folder


@pytest.mark.parametrize("backend, victim", [("reference", "prefill/weights.safetensors"),
                                             ("onnx", "weights.bin"), ("triton", "model_triton.py")])
def test_a_truncated_or_altered_file_fails_its_check_at_load(tmp_path, gpt2, backend, victim):
    out = tmp_path / backend
    be = backends.get(backend)
    k3c.compile(gpt2, backend, (_ids(),), out_dir=out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert victim in manifest["files"] and all(f["sha256"] for f in manifest["files"].values())
    data = (out / victim).read_bytes()
    (out / victim).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=f"{victim} has {len(data) // 2} bytes"):
        be.load(out)
    (out / victim).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ArtifactError, match=f"{victim} fails its SHA-256"):
        be.load(out)


_LOAD_AND_RUN = """
import sys, torch
from k3c.backends.tvm import TvmRunner
from k3c.errors import ArtifactError
try:
    TvmRunner(sys.argv[1]).run("prefill", torch.zeros(1, 3, dtype=torch.int64))
except ArtifactError as e:
    print(e)
    sys.exit(3)
"""


def test_a_truncated_tvm_library_is_an_error_not_a_crash(tmp_path, gpt2):
    out = tmp_path / "tvm"
    k3c.compile(gpt2, "tvm", (_ids(),), out_dir=out)
    lib = (out / "lib.so").read_bytes()
    (out / "lib.so").write_bytes(lib[: len(lib) // 3])
    proc = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])  # SIGBUS would be -7
    assert "lib.so has" in proc.stdout


def test_diff_and_bench_remove_their_temporary_folders(tmp_path, monkeypatch, gpt2):
    from k3c.bench import bench
    from k3c.diff import diff

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    diff(gpt2, ["reference"], seq_len=8, decode_steps=1)
    bench(gpt2, ["reference"], seq_len=8, decode_steps=1, warmup=0, repeats=1, torch_compile=False, progress=False)
    assert list(tmp_path.iterdir()) == []
    report = diff(gpt2, ["reference"], seq_len=8, decode_steps=1, keep=True)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("k3c-diff-")]
    assert len(kept) == 1 and report.backends["reference"].artifact.startswith(str(kept[0]))
