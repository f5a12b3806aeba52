"""The manifest guards the whole folder, not only what it lists. Before: removing a file's
entry (or emptying `files`) skipped its check, so half-zeroed weights ran (logits off by 4.2);
`../x` was read from outside the folder; the reference entries could name `../../other/decode`;
an unlisted, truncated `lib.so` was mapped (SIGBUS, exit -7)."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
import torch
from security_testlib import T, copy_of, edit_manifest

import k3c
from k3c.errors import ArtifactError, ManifestError

WEIGHTS = {"reference": "prefill/weights.safetensors", "onnx": "weights.bin", "tvm": "weights.safetensors",
           "triton": "weights.safetensors"}


def _load_and_prefill(backend: str, out):
    runner = k3c.backends.get(backend).load(out)
    return runner.run("prefill", torch.zeros(1, T, dtype=torch.long), torch.tensor([T]))


def _zero_half(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend", ["reference", "onnx", "tvm", "triton"])
def test_a_file_left_out_of_the_manifest_is_refused(fresh, backend):
    out, _ = fresh(backend)
    name = WEIGHTS[backend]
    _zero_half(out / name)
    edit_manifest(out, lambda m: m["files"].pop(name))
    with pytest.raises(ArtifactError, match=f"{name!r} is not listed"):
        _load_and_prefill(backend, out)


@pytest.mark.parametrize("backend", ["reference", "onnx"])
def test_an_emptied_file_list_is_refused(fresh, backend):
    out, _ = fresh(backend)
    edit_manifest(out, lambda m: m.update(files={}))
    with pytest.raises(ManifestError, match="'files' lists no file"):
        _load_and_prefill(backend, out)


@pytest.mark.parametrize("name", ["../x", "/etc/hostname", "a/../../x", "./weights.bin"])
def test_a_file_entry_that_leaves_the_folder_is_refused(fresh, name):
    out, _ = fresh("onnx")
    outside = out.parent / "x"
    outside.write_bytes(b"data outside the artifact")
    entry = {"bytes": outside.stat().st_size, "sha256": hashlib.sha256(outside.read_bytes()).hexdigest()}
    edit_manifest(out, lambda m: m["files"].update({name: entry}))
    with pytest.raises(ManifestError, match="plain relative path inside its folder"):
        _load_and_prefill("onnx", out)


def test_reference_entries_cannot_name_another_folder(fresh, tmp_path):
    out, _ = fresh("reference")
    other = tmp_path / "up" / "other"  # a whole, valid graph there: only the path stops it
    copy_of(out / "decode", other / "decode")
    shutil.move(out, tmp_path / "up" / "in" / "reference")
    out = tmp_path / "up" / "in" / "reference"
    edit_manifest(out, lambda m: m.update(entries=["prefill", "../../other/decode"]))
    with pytest.raises(ManifestError, match="entries"):
        _load_and_prefill("reference", out)


@pytest.mark.parametrize("backend", ["onnx", "reference"])
def test_a_link_out_of_the_folder_is_refused(fresh, tmp_path, backend):
    out, _ = fresh(backend)
    name = WEIGHTS[backend]
    outside = tmp_path / "elsewhere.bin"
    shutil.copyfile(out / name, outside)  # the same bytes: the checksum alone would pass it
    (out / name).unlink()
    os.symlink(outside, out / name)
    with pytest.raises(ArtifactError, match="outside the artifact"):
        _load_and_prefill(backend, out)


def test_a_loop_of_links_is_refused(fresh):
    out, _ = fresh("onnx")
    os.symlink("loop-b", out / "loop-a")
    os.symlink("loop-a", out / "loop-b")
    with pytest.raises(ArtifactError, match="loop-[ab] is a link .*loop"):
        _load_and_prefill("onnx", out)


def test_a_fifo_in_the_folder_is_refused_without_reading_it(fresh):
    out, _ = fresh("onnx")
    os.mkfifo(out / "pipe")
    with pytest.raises(ArtifactError, match="'?pipe'? is not a regular file"):
        _load_and_prefill("onnx", out)


def test_an_unlisted_truncated_tvm_library_is_refused_not_mapped(fresh):
    out, _ = fresh("tvm")
    with open(out / "lib.so", "r+b") as f:
        f.truncate(4096)
    edit_manifest(out, lambda m: m["files"].pop("lib.so"))
    with pytest.raises(ArtifactError, match="lib.so"):
        _load_and_prefill("tvm", out)


def test_the_untouched_copy_loads_and_runs(fresh):
    """The guards above refuse what they were built for, not every artifact."""
    for backend in ("reference", "onnx"):
        out, _ = fresh(backend)
        assert _load_and_prefill(backend, out)[0].shape[:2] == (1, T)


def test_onnx_external_data_outside_the_folder_is_refused(fresh):
    """A consistent manifest (digests recomputed) cannot vouch for a model whose weights lie
    elsewhere: onnxruntime would read whatever file the model names."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    out, _ = fresh("onnx")
    shutil.copyfile(out / "weights.bin", out.parent / "outside.bin")
    model = onnx.load(str(out / "prefill.onnx"), load_external_data=False)
    for t in _get_all_tensors(model):
        for kv in t.external_data:
            if kv.key == "location":
                kv.value = "../outside.bin"
    onnx.save_model(model, str(out / "prefill.onnx"))
    data = (out / "prefill.onnx").read_bytes()
    edit_manifest(out, lambda m: m["files"].update({"prefill.onnx": {
        "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}))
    with pytest.raises(ManifestError, match=r"prefill\.onnx tensor .*'\.\./outside\.bin'"):
        _load_and_prefill("onnx", out)
