"""Entries captured side by side in forked children (frontend/side_by_side.py, k3c/forked.py)
equal the entries captured one after another, and a child's failure is the error a capture
here raises. A test worker runs threads of its own (where forking is refused), so each case
runs in a fresh single-threaded interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from k3c.forked import cores

pytestmark = pytest.mark.skipif(cores() < 2 or not hasattr(__import__("os"), "fork"),
                                reason="side by side capture needs fork and two cores")


def run(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_entries_captured_in_children_equal_those_captured_here():
    out = run("""
        import os, torch
        from k3c import models
        from k3c.compiler import capture_entries
        from k3c.frontend import side_by_side
        from k3c.ir import print_graph

        model = models.build("k3-tiny")
        ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
        entries = ("prefill", "decode", "extend")
        forked = capture_entries(model, (ids,), entries=entries)
        assert side_by_side.children_used == 1, side_by_side.children_used  # two cores: decode in a child
        os.environ["K3C_FORK"] = "0"
        here = capture_entries(model, (ids,), entries=entries)
        assert side_by_side.children_used == 1
        own = {p.untyped_storage().data_ptr() for p in model.parameters()}
        for e in entries:
            assert list(forked) == list(entries)
            assert print_graph(forked[e]) == print_graph(here[e]), e
            assert forked[e].meta == here[e].meta, e
            assert list(forked[e].weights) == list(here[e].weights)
            for w, t in forked[e].weights.items():
                u = here[e].weights[w]
                assert t.dtype == u.dtype and t.shape == u.shape and torch.equal(t, u), (e, w)
                # the model's own tensors are shared, not copies sent back by the child
                assert (t.untyped_storage().data_ptr() in own) == (u.untyped_storage().data_ptr() in own), (e, w)
        print("shared", sum(t.untyped_storage().data_ptr() in own for t in forked["decode"].weights.values()))
    """)
    assert int(out.split()[-1]) > 50  # k3-tiny's decode reads its parameters as they are


def test_a_child_that_fails_is_captured_here_with_its_error():
    out = run("""
        from k3c.frontend import side_by_side
        from k3c.ir import Graph

        def capture_one(entry):
            if entry == "b":
                raise ValueError("entry b: unsupported op aten.foo (model.py:12)")
            return Graph(name=entry)

        try:
            side_by_side.capture_all(capture_one, ("a", "b"), model=__import__("torch").nn.Linear(2, 2))
        except ValueError as e:
            print("raised:", e)
        assert side_by_side.children_used == 0
        got = side_by_side.capture_all(lambda e: Graph(name=e), ("a", "b", "c"), __import__("torch").nn.Linear(2, 2))
        assert [g.name for g in got.values()] == ["a", "b", "c"] and side_by_side.children_used == 1
    """)
    assert "raised: entry b: unsupported op aten.foo (model.py:12)" in out


def test_a_child_that_hangs_is_killed_and_its_entry_captured_here():
    out = run("""
        import os, time
        from k3c.frontend import side_by_side
        from k3c.ir import Graph

        parent = os.getpid()
        side_by_side.PATIENCE = 1.0

        def capture_one(entry):
            if os.getpid() != parent:
                time.sleep(600)  # as on a lock no thread of the child will release
            return Graph(name=entry)

        t0 = time.monotonic()
        got = side_by_side.capture_all(capture_one, ("a", "b"), __import__("torch").nn.Linear(2, 2))
        assert [g.name for g in got.values()] == ["a", "b"] and side_by_side.children_used == 0
        print("seconds", time.monotonic() - t0)
    """)
    assert float(out.split()[-1]) < 30


def test_no_fork_where_threads_run():
    """Nor where a thread runs that `threading` does not list (pytest-xdist's, started by
    `_thread`): a child forked beside one deadlocked in torch.export, on a lock it held."""
    run("""
        import _thread, threading, time
        from k3c.forked import usable
        assert usable()
        stop = threading.Event()
        t = threading.Thread(target=stop.wait); t.start()
        try:
            assert not usable()  # a thread may hold a lock the child would wait for
        finally:
            stop.set(); t.join()
        assert usable()
        started, release, done = threading.Event(), threading.Event(), threading.Event()
        _thread.start_new_thread(lambda: (started.set(), release.wait(), done.set()), ())
        started.wait()
        try:
            assert threading.active_count() == 1 and not usable()
        finally:
            release.set(); done.wait()
        for _ in range(200):  # the thread's state goes once its function has returned
            if usable():
                break
            time.sleep(0.01)
        assert usable()
    """)


def test_no_fork_in_a_test_worker():
    from k3c.forked import usable

    if "PYTEST_XDIST_WORKER" not in __import__("os").environ:
        pytest.skip("runs in a pytest-xdist worker (-n 2)")
    assert not usable()  # execnet's thread
