"""Setup of the pass tests: one torch thread. The interpreter runs thousands of tiny ops,
where a second thread only adds synchronisation (ten times the CPU time on a busy machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
