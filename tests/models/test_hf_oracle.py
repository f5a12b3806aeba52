"""An independent oracle: HF transformers' KimiLinearForCausalLM on our kimi-linear-tiny.

transformers reads our saved checkpoint with its own loader (its conversion from the release
layout), and we read what it saves. Logits must agree at T = 20 and across a chunk edge
(T = 70), and so must cached decoding. transformers picks fla's GPU kernels whenever fla is
importable, so the comparison runs in a subprocess where `import fla` fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["fla"] = None  # transformers must take its PyTorch reference paths
    import json
    import torch
    from transformers import KimiLinearForCausalLM
    from k3c.models import build, from_pretrained, save_pretrained
    from k3c.numerics import compare

    ours_dir, hf_dir = sys.argv[1], sys.argv[2]
    ours = build("kimi-linear-tiny", seed=0)
    save_pretrained(ours, ours_dir)
    hf = KimiLinearForCausalLM.from_pretrained(ours_dir, attn_implementation="eager", dtype=torch.float32).eval()
    out = {}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ours.config.vocab_size, (2, 70), generator=gen)
    with torch.no_grad():
        for T in (20, 70):
            c = compare(hf(ids[:, :T]).logits, ours(ids[:, :T]))
            out[f"logits_T{T}"] = [c.ok, c.max_abs_err, c.rel_rms_err]
        step = hf(ids[:, :20], use_cache=True)
        cache, got = step.cache, [step.logits]
        logits, state = ours.prefill(ids[:, :20])
        want = [logits]
        for t in range(20, 24):
            step = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = step.cache
            got.append(step.logits)
            logits, state = ours.decode(ids[:, t : t + 1], state)
            want.append(logits)
        c = compare(torch.cat(got, 1), torch.cat(want, 1))
        out["decode"] = [c.ok, c.max_abs_err, c.rel_rms_err]
        hf.save_pretrained(hf_dir)
        back = from_pretrained(hf_dir)
        a, b = back.state_dict(), ours.state_dict()
        out["weights_back"] = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        c = compare(back(ids), ours(ids))
        out["logits_back"] = [c.ok, c.max_abs_err, c.rel_rms_err]
    print("RESULT " + json.dumps(out))
    """
)


def test_hf_kimi_linear_agrees(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # from outside the repository: its top-level folders are k3c's source, not packages, and
    # transformers looks for a package named `kernels` (tests/test_layout.py has that case)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ours"), str(tmp_path / "hf")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    for key in ("logits_T20", "logits_T70", "decode", "logits_back"):
        ok, max_abs, rel_rms = result[key]
        assert ok, f"{key}: HF vs k3c max_abs_err={max_abs:.3e} rel_rms_err={rel_rms:.3e}"
    assert result["weights_back"], "weights saved by transformers do not load back bit for bit"
