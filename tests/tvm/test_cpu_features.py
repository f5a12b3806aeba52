"""The CPU an llvm artifact is built for (backends/tvm/target.py): this host by default, with
the features its OS reports; another CPU by `llvm -mcpu=NAME`, whose features the manifest
names; an artifact whose features this host lacks is refused with one line when it would
first run, before its library is mapped (its kernels would stop the process with an illegal
instruction); building it and opening its folder work anywhere."""

from __future__ import annotations

import json

import pytest
import torch

import k3c
from k3c.backends.tvm import TvmBackend, cache
from k3c.backends.tvm.target import CPU_FEATURES, host_features, make_target
from k3c.errors import ArtifactError, UsageError
from k3c.numerics import assert_close

GRAPH = """graph g {
  dim M in [1, inf]
  input %x: f32[M, 24]
  weight %w: f32[40, 24]
  %y: f32[M, 40] = linear(%x, %w)
  output y = %y
}
"""
OTHER = "llvm -mcpu=sapphirerapids"  # AVX-512 BF16 and AMX: what this project's CI hosts lack


def _graphs():
    g = k3c.ir.parse(GRAPH)
    g.weights["w"] = torch.randn(40, 24, generator=torch.Generator().manual_seed(0))
    return {"forward": g}


def test_host_features_are_the_os_flags():
    flags = next(line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    names = {"avx512bf16": "avx512_bf16", "avx512vnni": "avx512_vnni"}
    assert list(host_features()) == [f for f in CPU_FEATURES if names.get(f, f.replace("-", "_")) in flags]


def test_a_build_for_another_cpu_names_its_features_and_this_host_refuses_what_it_lacks(tmp_path):
    graphs = _graphs()
    here = TvmBackend().lower(graphs, tmp_path / "here")
    there = TvmBackend(target=OTHER).lower(graphs, tmp_path / "there")
    m_here = json.loads((here / "manifest.json").read_text())
    m_there = json.loads((there / "manifest.json").read_text())
    assert m_here["cpu_features"] == list(host_features())
    assert {"avx512f", "avx512bf16", "amx-bf16", "amx-tile"} <= set(m_there["cpu_features"])
    assert '"mcpu":"sapphirerapids"' in m_there["target_string"].replace(" ", "")
    x = torch.randn(5, 24, generator=torch.Generator().manual_seed(1))
    (y,) = TvmBackend().load(here).run("forward", x)
    assert_close(y, x @ graphs["forward"].weights["w"].T, what="host build")
    missing = [f for f in m_there["cpu_features"] if f not in host_features()]
    if not missing:
        pytest.skip("this host has every feature of a Sapphire Rapids: it runs that build")
    runner = TvmBackend().load(there)
    with pytest.raises(ArtifactError) as e:
        runner.run("forward", x)
    msg = str(e.value)
    assert "\n" not in msg and "-mcpu=sapphirerapids" in msg and all(f in msg for f in missing), msg


def test_the_cache_key_holds_the_cpu():
    graphs = _graphs()
    here = cache.key(graphs, "llvm", {})
    assert cache.key(graphs, "llvm", {"mcpu": "sapphirerapids"}) != here
    assert cache.key(graphs, "llvm", {}) == here


@pytest.mark.parametrize("target", ["llvm -mcpu=nosuchcpu", "metal", "llvm -mcpu"])
def test_an_unknown_target_is_one_line(target):
    with pytest.raises(UsageError) as e:
        TvmBackend(target=target)
    assert "\n" not in str(e.value) and target in str(e.value)


def test_the_host_target_turns_off_what_the_os_does_not_enable():
    t = make_target("llvm")
    from k3c.backends.tvm.target import cpu_features

    assert cpu_features(t) == list(host_features()), str(t)
