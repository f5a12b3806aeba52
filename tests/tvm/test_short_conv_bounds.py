"""The TVM short_conv kernel reads only inside its buffers: x placed right after an
inaccessible page and the state right before one, so a load before x's first row or past
the state's end is a segfault (k3-small's prefill of 16384 tokens crashed so, where the page
before x happened to be unmapped). The kernel runs in a child process: a crash there is this
test's failure, not the test session's; its outputs are compared with the naive definition."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import ctypes, mmap
    import torch, tvm
    from tvm import s_tir
    from k3c.backends.tvm.target import make_target
    from k3c.kernels.short_conv.naive import naive_short_conv
    from k3c.kernels.short_conv.tvm import schedule_llvm, short_conv
    from k3c.numerics import assert_close

    B, L, C, W = {B}, {L}, {C}, {W}
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    PAGE = mmap.PAGESIZE

    def guarded(shape, before):
        # a float32 tensor flush against a PROT_NONE page: the page `before` it, else after it
        n = 1
        for s in shape:
            n *= s
        pages = -(-n * 4 // PAGE)
        base = libc.mmap(None, (pages + 2) * PAGE, 3, 0x22, -1, 0)  # RW, private | anonymous
        assert base not in (None, ctypes.c_void_p(-1).value)
        assert libc.mprotect(base, PAGE, 0) == 0 and libc.mprotect(base + (pages + 1) * PAGE, PAGE, 0) == 0
        start = base + PAGE if before else base + (pages + 1) * PAGE - n * 4
        assert start % 64 == 0
        return torch.frombuffer((ctypes.c_float * n).from_address(start), dtype=torch.float32).view(shape)

    gen = torch.Generator().manual_seed(0)
    x = guarded((B, L, C), before=True)
    s0 = guarded((B, C, W - 1), before=False)
    x.copy_(torch.randn(B, L, C, generator=gen))
    s0.copy_(torch.randn(B, C, W - 1, generator=gen))
    w = torch.randn(C, W, generator=gen)
    y, s1 = torch.full((B, L, C), float("nan")), torch.full((B, C, W - 1), float("nan"))
    sch = s_tir.Schedule(short_conv(C, W, "silu"))
    schedule_llvm(sch)
    lib = tvm.compile(sch.mod, target=make_target("llvm"))
    t = tvm.runtime.from_dlpack
    lib(t(x), t(w), t(s0), t(y), t(s1))
    y_ref, s1_ref = naive_short_conv(x.clone(), w, s0.clone(), "silu")
    assert_close(y, y_ref, what="short_conv y")
    assert_close(s1, s1_ref, what="short_conv state")
    print("ok")
""")


def test_short_conv_reads_stay_in_bounds():
    # L spans several pages of x; the state is far smaller than L rows, so an unclamped
    # state load at a late step lands past its guard page too
    code = CHILD.format(B=1, L=300, C=16, W=4)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
    why = "a segfault: a load outside a buffer" if run.returncode == -11 else " | ".join(tail)
    ok = run.returncode == 0 and run.stdout.strip().endswith("ok")
    assert ok, f"short_conv kernel child exited {run.returncode}: {why}"
