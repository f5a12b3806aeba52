"""benchmarks/bench_serving.py: its quick mode runs end to end and every check it prints holds
(chunked prefill equals one prefill, prefix reuse equals recomputing, speculative tokens equal
plain greedy, a slot equals its sequence alone); its prompt-lookup draft proposes what it
should. Speeds are not checked."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from k3c.numerics import TOLERANCES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serving.py"
ROW = TOLERANCES[torch.float32]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_serving", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_flags_a_difference_past_the_fp32_row():
    check = load_script().check
    a = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    assert check(a.clone(), a) == (0.0, True)
    err, ok = check(a * (1 + 10 * ROW.rel_rms), a)
    assert not ok and err == pytest.approx(10 * ROW.rel_rms, rel=1e-3)


def test_ngram_draft_proposes_what_followed_the_last_token_and_rolls_back():
    draft = load_script().NgramDraft(vocab=16, capacity=12)
    logits, state = draft.prefill(torch.tensor([[3, 5, 7, 3], [1, 2, 4, 8]]))
    assert logits.shape == (2, 1, 16)
    assert logits[:, -1].argmax(-1).tolist() == [5, 0]  # 3 was followed by 5; 8 never came before
    logits, after = draft.decode(torch.tensor([[5], [2]]), state)  # ... 3, 5 -> 7 ; ... 8, 2 -> 4
    assert logits[:, -1].argmax(-1).tolist() == [7, 4] and after["positions"].tolist() == [5, 5]
    assert state["positions"].tolist() == [4, 4] and state["tokens"][0, 4] == 0  # the state given is unchanged
    _, kept = draft.extend(torch.tensor([[9, 9], [9, 9]]), state, lengths=torch.tensor([2, 0]))
    assert kept["positions"].tolist() == [6, 4] and kept["tokens"][1, 4] == 0  # a row of length 0 keeps its state


@pytest.mark.slow  # compiles a k3-tiny artifact and runs two prefills in processes of their own: about a minute
def test_quick_mode_every_check_holds(tmp_path):
    out = tmp_path / "serving.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--backend", "onnx:ort", "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["ok"] and r["rows"] == ["chunked", "prefix", "speculative", "slots"]
    c = r["chunked"]
    assert c["ok"] and c["logits_rel_rms"] <= ROW.rel_rms and c["state_rel_rms"] <= ROW.rel_rms
    assert c["one prefill"]["peak_rss"] > 0 and c["pieces of 32"]["peak_rss"] > 0
    assert r["prefix"]["ok"] and r["prefix"]["logits_rel_rms"] <= ROW.rel_rms
    drafts = r["speculative"]["drafts"]
    assert set(drafts) == {"ngram", "self"} and all(d["tokens_equal"] for d in drafts.values())
    assert drafts["self"]["acceptance"] == 1.0  # the target drafting for itself agrees with itself
    s = r["slots"]
    assert s["ok"] and s["slot0_rel_rms"] <= ROW.rel_rms and s["slots"] == 32 and s["fused"] is None
    assert s["multiple_of_floor"] == pytest.approx(s["seconds_per_step"] / s["floor_seconds"])
    for line in ("logits", "tokens equal", "slot 0 vs alone", "absent: onnx:ort has no kernel of its own for"):
        assert line in r["table"] and line in p.stdout
    assert "OFF" not in r["table"] and "DIFFER" not in r["table"]


@pytest.mark.slow  # two k3-tiny TVM artifacts (unfused and fused decode): about a minute
def test_quick_slots_row_on_tvm_has_the_fused_step(tmp_path):
    out = tmp_path / "slots.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--rows", "slots", "--backend", "tvm", "--json",
                        str(out)], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    s = json.loads(out.read_text())["slots"]
    f = s["fused"]
    assert s["ok"] and f is not None and f["kda_layers"] == 3  # k3-tiny cut to 4 layers: 3 KDA, 1 MLA
    assert f["slot0_rel_rms"] <= ROW.rel_rms and f["vs_unfused_rel_rms"] <= ROW.rel_rms
    assert f["multiple_of_floor"] == pytest.approx(f["seconds_per_step"] / s["floor_seconds"])
    assert "fused KDA step" in p.stdout and "absent" not in p.stdout
