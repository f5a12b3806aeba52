"""`k3c plan` and `k3c diff --mesh` on the command line: the JSON form, and one-line errors."""

from __future__ import annotations

import json

from k3c.cli import main


def test_plan_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "kimi-linear-tiny", "--mesh", "tp=2,ep=2", "--seq-len", "16",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kimi-linear-tiny on 4 ranks (tp=2, ep=2)" in text and "all_reduce" in text
    p = json.loads(out.read_text())
    assert p["mesh"] == {"tp": 2, "ep": 2, "world": 4, "vocab": False, "dp": 1, "pp": 1, "plan_only": False}
    assert [r["rank"] for r in p["ranks"]] == [0, 1, 2, 3]
    assert all(r["weight_bytes"] > 0 and r["state_bytes"] > 0 for r in p["ranks"])
    assert set(p["per_token"]) == {"prefill", "decode"}


def test_mesh_errors_are_one_line(capsys):
    assert main(["plan", "--model", "k3-tiny", "--mesh", "tp=3"]) == 2
    err = capsys.readouterr().err
    assert "tp=3 does not divide the 4 KDA heads" in err and "Traceback" not in err
    assert main(["diff", "--model", "kimi-linear-tiny", "--backends", "reference", "--mesh", "ep=3"]) == 2
    err = capsys.readouterr().err
    assert "ep=3 does not divide the 8 routed experts" in err and "Traceback" not in err
    assert main(["plan", "--model", "k3-tiny", "--mesh", "tp=two"]) == 2
    assert "expected axes like 'tp=2,ep=2'" in capsys.readouterr().err
