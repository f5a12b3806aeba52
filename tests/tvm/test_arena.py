"""The VM's parameters on transparent huge pages (backends/tvm/arena.py): copied bit for bit,
64-byte aligned in one mapping, the mapping backed by 2 MB pages where the OS grants them, and
a runner's outputs the same with the parameters there or where TVM put them."""

from __future__ import annotations

import pytest
import torch
import tvm
from factories import example_ids

from k3c.backends.tvm import TvmRunner, arena

needs_thp = pytest.mark.skipif(not arena.available(), reason="no transparent huge pages on this OS")


def _tvm_tensors(gen: torch.Generator) -> list:
    shapes = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((2, 33, 16), torch.uint8), ((), torch.int64),
              ((0, 4), torch.float32), ((1024, 1024), torch.float32)]  # the last spans 2 MB pages
    out = []
    for shape, dtype in shapes:
        x = torch.randn(shape, generator=gen) * 100
        out.append(tvm.runtime.from_dlpack(x.to(dtype).contiguous().clone()))
    return out


@needs_thp
def test_place_copies_every_parameter_aligned_into_one_mapping():
    params = _tvm_tensors(torch.Generator().manual_seed(0))
    want = [torch.from_dlpack(p).clone() for p in params]
    placed = arena.place(params)
    assert params == [None] * len(want)  # each original dropped once copied
    got = [torch.from_dlpack(p) for p in placed]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g.view(-1).view(torch.uint8),
                                                                        w.view(-1).view(torch.uint8))
    starts = [g.data_ptr() for g in got if g.numel()]
    assert all(s % arena.ALIGN == 0 for s in starts)
    assert max(starts) - min(starts) < sum(g.numel() * g.element_size() for g in got) + arena.ALIGN * len(got)


@needs_thp
def test_a_huge_buffer_is_backed_by_huge_pages():
    buf = arena.huge_buffer(8 << 20)
    buf.fill_(1)  # first touch: the faults take 2 MB pages
    start, end = buf.data_ptr(), buf.data_ptr() + buf.numel()
    huge_kb = 0
    region = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            region = lo <= start < hi or lo < end <= hi
        elif region and line.startswith("AnonHugePages:"):
            huge_kb += int(line.split()[1])
    assert huge_kb >= 2048, huge_kb


def test_huge_pages_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("K3C_HUGE_PAGES", "0")
    params = _tvm_tensors(torch.Generator().manual_seed(1))
    assert not arena.available() and arena.huge_buffer(1 << 20) is None
    assert arena.place(params) is params


def test_a_runner_computes_the_same_with_its_parameters_on_huge_pages(tvm_zoo, monkeypatch):
    model, _, out, _ = tvm_zoo("k3-tiny")
    ids = example_ids(model, 2, 5)
    placed = TvmRunner(out).run("prefill", ids)
    monkeypatch.setenv("K3C_HUGE_PAGES", "0")
    where_tvm_put_them = TvmRunner(out).run("prefill", ids)
    assert all(torch.equal(a, b) for a, b in zip(placed, where_tvm_put_them))
