"""Kernel tests run single-threaded: their shapes are tiny, and on a busy 2-core machine the
intra-op thread pool costs more in synchronisation than it saves."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
