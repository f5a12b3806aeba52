"""Random mutations of real manifests (reference, ONNX, TVM): whatever the manifest holds, only
k3c's own error classes escape the loader and the input check it drives, each within a second
of CPU beyond what loading the unmutated artifact takes.
The artifacts are built once; each example rewrites only manifest.json and reads it back."""

from __future__ import annotations

import json
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_testlib import T, copy_of, manifest

import k3c
from k3c.backends.onnx.runner import check_inputs as onnx_check
from k3c.backends.reference import entry_names
from k3c.errors import K3cError

BACKENDS = ("reference", "onnx", "tvm")
PAYLOADS = ["T+__import__('os').system('false')", "10**10**10", "((T**8)**8)**8", "(B+T+1)**8*(B+T+2)**8",
            "../x", "/etc/passwd", "a/../../b", "Mod(T, 0)", "T/(B-B)", "ceiling(T/0)", "B*T", "T", "99",
            "k3c-onnx", "k3c-tvm/1", "k3c-reference/1", "", "\x00", "x" * 300, "lib.so", "weights.bin"]
SCALARS = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.sampled_from([0, 1, -1, 99, 1 << 62])
           | st.floats() | st.text(max_size=12) | st.sampled_from(PAYLOADS))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(["B", "T", "name", "shape", "0", "x"]) | st.text(max_size=6),
                                        inner, max_size=4), max_leaves=8)


@pytest.fixture(scope="module")
def folders(built, tmp_path_factory):
    """backend -> (a copy of its artifact whose manifest the examples rewrite, the original manifest)."""
    root = tmp_path_factory.mktemp("fuzz")
    return {b: (copy_of(built(b)[0], root / b), manifest(built(b)[0])) for b in BACKENDS}


@pytest.fixture(scope="module")
def clean_load_cpu(folders):
    """backend -> the CPU seconds of loading and checking its unmutated artifact (the most of
    three warm loads): a TVM load opens a shared library and reads the weights, which alone
    came near a second on a loaded machine."""
    out = {}
    for backend, (folder, original) in folders.items():
        (folder / "manifest.json").write_text(json.dumps(original))
        _load_and_check(backend, folder)  # imports and first-use work, not timed
        times = []
        for _ in range(3):
            cpu = time.process_time()
            _load_and_check(backend, folder)
            times.append(time.process_time() - cpu)
        out[backend] = max(times)
    return out


def _mutate(data, m):
    """Replace, delete or add one member somewhere in `m` (a walk down from the root)."""
    if not isinstance(m, (dict, list)) or not m or data.draw(st.integers(0, 3)) == 0:
        return data.draw(VALUES)
    if isinstance(m, dict):
        key = data.draw(st.sampled_from(sorted(m)))
        op = data.draw(st.sampled_from(["descend", "descend", "delete", "add"]))
        if op == "delete":
            return {k: v for k, v in m.items() if k != key}
        if op == "add":
            return {**m, data.draw(st.text(max_size=8) | st.sampled_from(["limits", "format_version", "ids"])):
                    data.draw(VALUES)}
        return {**m, key: _mutate(data, m[key])}
    i = data.draw(st.integers(0, len(m) - 1))
    return m[:i] + [_mutate(data, m[i])] + m[i + 1:]


def _load_and_check(backend: str, out) -> None:
    """Load the artifact and check prefill's inputs against its manifest (no kernel runs); of a
    reference artifact, check the manifest only (its graphs are the IR parser's to check)."""
    if backend == "reference":
        entry_names(out)
        return
    runner = k3c.backends.get(backend).load(out)
    ids, lengths = torch.zeros(1, T, dtype=torch.long), torch.tensor([T])
    if backend == "onnx":
        entry = runner.manifest["entries"].get("prefill")
        if entry is not None:
            onnx_check("prefill", entry["inputs"], [ids.numpy(), lengths.numpy()], runner.manifest["dims"],
                       runner._parsed["prefill"])
    elif backend == "tvm" and "prefill" in runner.entries:
        runner.check_inputs("prefill", (ids, lengths))


@settings(max_examples=1000, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_manifest_raises_only_k3c_errors_quickly(folders, clean_load_cpu, data):
    backend = data.draw(st.sampled_from(BACKENDS))
    out, original = folders[backend]
    m = original
    for _ in range(data.draw(st.integers(1, 3))):
        m = _mutate(data, m)
    (out / "manifest.json").write_text(json.dumps(m, allow_nan=True))
    # "within a second" is this process's CPU time beyond an unmutated load's: the work a
    # manifest makes k3c do (a shape like 10**10**10 once spun for minutes). Wall time on a
    # shared 2-core machine also counts the other test worker, so it bounds only waiting (a
    # FIFO, a lock) and gets more room.
    # A first use of some path (a lazy import, a library's one-time set-up, a collection of the
    # worker's heap) is not work the manifest makes k3c do: over the bound, it is measured
    # again, and the second load must keep to it.
    for _ in range(2):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            _load_and_check(backend, out)
        except K3cError:
            pass
        spent, waited = time.process_time() - cpu, time.perf_counter() - start
        if spent < clean_load_cpu[backend] + 1.0 and waited < 10.0:
            break
    assert spent < clean_load_cpu[backend] + 1.0
    assert waited < 10.0


def test_the_unmutated_manifests_load(folders):
    """The property above is not vacuous: the manifests it starts from load and check clean."""
    for backend, (out, original) in folders.items():
        (out / "manifest.json").write_text(json.dumps(original))
        _load_and_check(backend, out)
