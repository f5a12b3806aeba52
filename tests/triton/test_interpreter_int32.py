"""Under triton's interpreter the int32 overflow checks that its device assert would drop
anyway (the builder's options do not say `debug`) are not computed
(kernels/common/triton/__init__.py), and int32 arithmetic wraps as a compiled kernel's does."""

from __future__ import annotations

import pytest
import torch

from k3c.kernels.common import triton as common

import triton  # isort: skip
import triton.language as tl  # isort: skip


@triton.jit
def _mul_add_int32(x, y, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + o, mask=o < N, other=0)
    tl.store(y + o, v * v + v * 65537 + 2_000_000_000, mask=o < N)


@pytest.mark.skipif(not common.INTERPRET, reason="the interpreter's options; a compiled kernel has its own")
def test_the_interpreter_computes_no_overflow_check_its_assert_would_drop():
    from triton.runtime import interpreter as itp

    options = itp.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow


def test_int32_arithmetic_wraps_as_on_the_gpu():
    x = torch.tensor([0, 1, 40_000, -40_000, 2**31 - 1, -(2**31), 123_456_789], dtype=torch.int32,
                     device=common.DEVICE)
    y = torch.empty_like(x)
    _mul_add_int32[(1,)](x, y, x.numel(), BLOCK=8)
    v = x.cpu().long()
    wrapped = (v * v + v * 65537 + 2_000_000_000 + 2**31) % 2**32 - 2**31  # two's complement
    assert torch.equal(y.cpu().long(), wrapped)
