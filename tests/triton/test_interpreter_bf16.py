"""Under triton's interpreter a float32 -> bfloat16 store rounds as a GPU does (to nearest, ties
to even: `cvt.rn.bf16.f32`), the same bits as torch's conversion; the interpreter by itself
truncates (kernels/common/triton/__init__.py patches it)."""

from __future__ import annotations

import pytest
import torch

from k3c.kernels.common import triton as common

import triton  # isort: skip
import triton.language as tl  # isort: skip


@triton.jit
def _store_bf16(x, y, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + o, tl.load(x + o, mask=o < N, other=0.).to(y.dtype.element_ty), mask=o < N)


@pytest.mark.skipif(not common.INTERPRET, reason="the interpreter's conversion; a GPU rounds by itself")
def test_float32_to_bfloat16_rounds_to_nearest_even():
    one = torch.tensor(1.0)
    ulp = 2.0 ** -7  # of BF16 at 1
    special = torch.tensor([1 + ulp / 2, 1 + 1.5 * ulp, -(1 + ulp / 2), 1.9999999, -1.9999999, 3.0e38, -3.0e38,
                            1e-40, -1e-40, 0.0, -0.0, float("inf"), float("-inf"), 1.7627, -1.7627,
                            (one + ulp / 2 + 2.0 ** -20).item()])
    x = torch.cat([special, torch.randn(4000) * torch.logspace(-30, 30, 4000)]).float()
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    _store_bf16[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    want = x.to(torch.bfloat16)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16)), \
        [(a.item(), b.item(), c.item()) for a, b, c in zip(x, y.float(), want.float()) if b != c][:5]
    nan = torch.full((3,), float("nan"))
    yn = torch.empty(3, dtype=torch.bfloat16)
    _store_bf16[(1,)](nan, yn, 3, BLOCK=4)
    assert torch.isnan(yn.float()).all()
