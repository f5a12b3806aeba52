"""k3c as a transformers.exporters backend, against transformers' own eager KimiLinear.

transformers' tiny KimiLinearForCausalLM (its own random init, never saved; two layers, KDA
with the dense MLP and MLA with the routed experts, to keep the captures short) is exported
through `AutoHfExporter` with export format "k3c" to onnx and tvm, and run through the
registered runner: a prefill across a chunk edge (T = 66), decode steps fed with the runner's
own state, an extend of several tokens, and the program saved and read back by
`ExportedModel` (the TVM case, a build of tens of seconds, is in the slow tier). The oracle is
transformers' eager model with its cache. transformers takes fla's GPU kernels whenever fla is
importable, so the comparison runs in a subprocess where `import fla` fails
(tests/models/test_hf_oracle.py does the same).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (pip install transformers==5.24.0)")

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["fla"] = None  # transformers must take its PyTorch reference paths
    import json
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM
    from transformers.exporters import AutoHfExporter, ExportedModel
    from k3c.integrations.transformers import K3cExportConfig
    from k3c.models import config_for
    from k3c.models.checkpoint import kimi_config_to_json
    from k3c.numerics import compare

    torch.manual_seed(0)
    # two layers of kimi-linear-tiny: KDA with the dense MLP, then MLA with the routed experts
    tiny = config_for("kimi-linear-tiny", num_layers=2, mla_layers=(2,))
    hf = KimiLinearForCausalLM(KimiLinearConfig(**kimi_config_to_json(tiny))).eval()
    ids = torch.randint(0, hf.config.vocab_size, (2, 73), generator=torch.Generator().manual_seed(1))
    out = {}

    def check(name, got, want):
        c = compare(got, want)
        out[name] = [c.ok, c.max_abs_err, c.rel_rms_err]

    with torch.no_grad():
        step = hf(ids[:, :66], use_cache=True)
        want_prefill, cache, want_steps = step.logits, step.cache, []
        for t in range(66, 69):
            step = hf(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = step.cache
            want_steps.append(step.logits)
        want_extend = hf(ids[:, 69:73], cache=cache, use_cache=True).logits
        for backend in sys.argv[2:]:
            config = K3cExportConfig(backend=backend)
            exported = AutoHfExporter.from_config(config).export_for_generation(hf, {"input_ids": ids[:, :5]}, config)
            prefill, decode = exported.runners["prefill"], exported.runners["decode"]
            got = prefill(input_ids=ids[:, :66], attention_mask=torch.ones(2, 66, dtype=torch.long))
            check(f"{backend}.prefill", got.logits, want_prefill)
            state, steps = got.cache, []
            for t in range(66, 69):
                got = decode(input_ids=ids[:, t : t + 1], cache=state)
                state = got.cache
                steps.append(got.logits)
            check(f"{backend}.decode", torch.cat(steps, 1), torch.cat(want_steps, 1))
            check(f"{backend}.extend", decode(input_ids=ids[:, 69:73], cache=state).logits, want_extend)
            exported.save_pretrained(f"{sys.argv[1]}/{backend}")
            back = ExportedModel.from_pretrained(f"{sys.argv[1]}/{backend}")
            check(f"{backend}.reloaded", back.runners["prefill"](input_ids=ids[:, :66]).logits, want_prefill)
            try:
                decode(input_ids=ids[:, 66:67], cache=cache)
                out[f"{backend}.hf_cache_refused"] = ""
            except Exception as err:
                out[f"{backend}.hf_cache_refused"] = f"{type(err).__name__}: {err}"
    print("RESULT " + json.dumps(out))
    """
)


@needs_transformers
@pytest.mark.parametrize("backend", ["onnx", pytest.param("tvm", marks=pytest.mark.slow)])  # tvm: a build
def test_kimi_linear_through_auto_hf_exporter_matches_transformers_eager(tmp_path, backend):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # from outside the repository: its top-level folders are k3c's source, not packages
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), backend], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    for stage in ("prefill", "decode", "extend", "reloaded"):
        ok, max_abs, rel_rms = result[f"{backend}.{stage}"]
        assert ok, f"{backend} {stage}: k3c vs transformers max_abs_err={max_abs:.3e} rel_rms_err={rel_rms:.3e}"
    refused = result[f"{backend}.hf_cache_refused"]
    assert refused.startswith("InputError") and "DynamicCache" in refused, refused


def test_k3c_imports_without_transformers_and_the_integration_names_it(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        sys.modules["transformers"] = None  # as if it were not installed
        import k3c, k3c.integrations
        assert "transformers" not in [m for m in sys.modules if sys.modules[m] is not None]
        try:
            import k3c.integrations.transformers
        except k3c.integrations.MissingPackageError as err:
            print("ERROR " + str(err))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ERROR ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    message = lines[0].removeprefix("ERROR ")
    assert "'transformers'" in message and "pip install transformers" in message and "\n" not in message
