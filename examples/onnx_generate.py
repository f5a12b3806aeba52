"""Greedy generation from a k3c ONNX artifact with onnxruntime alone.

    python examples/onnx_generate.py DIR [--tokens N]

DIR holds prefill.onnx, decode.onnx, weights.bin and manifest.json (`k3c compile --model
k3-tiny --backend onnx --max-context 64 --out DIR`). When DIR has no manifest yet, k3-tiny is
compiled into it first, with fixed-capacity caches of 64 rows; that step needs k3c, the
generation itself only onnxruntime, numpy and json: the manifest says which outputs are state
and which decode input each one feeds. With fixed caches (manifest "serving") the prefill takes
the prompt's `lengths` and `prefill_last` returns only the last logits; the state then holds
every cache at capacity and `positions`, and each decode step writes one row of each cache.
An artifact with growing caches runs too.
"""

import json
import sys

import numpy as np
import onnxruntime as ort


def compile_k3_tiny(out_dir):
    """The only part that needs k3c: write the artifact."""
    import torch

    import k3c

    model = k3c.models.build("k3-tiny")
    k3c.compile(model, "onnx", (torch.zeros(2, 16, dtype=torch.long),), out_dir=out_dir, max_context=64)


def load_manifest(out_dir):
    try:
        with open(f"{out_dir}/manifest.json") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        compile_k3_tiny(out_dir)
        with open(f"{out_dir}/manifest.json") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        sys.exit(f"{out_dir}/manifest.json: cannot read it as JSON ({err})")
    # another backend's artifact (tvm, triton) has a manifest too, without ONNX graphs to run
    artifact = manifest.get("artifact") if isinstance(manifest, dict) else None
    backend = artifact.get("backend") if isinstance(artifact, dict) else None
    entries = manifest.get("entries") if isinstance(manifest, dict) else None
    if backend != "onnx" or not isinstance(entries, dict) or not {"prefill", "decode"} <= set(entries):
        sys.exit(f"{out_dir} holds a {backend or 'non-k3c'} artifact, not k3c's ONNX one (prefill.onnx, decode.onnx): "
                 f"compile with --backend onnx")
    return manifest


def generate(out_dir, prompt, new_tokens):
    manifest = load_manifest(out_dir)
    entries = manifest["entries"]
    prefill_spec = entries.get("prefill_last", entries["prefill"])  # last-token logits where compiled
    decode_spec = entries["decode"]
    capacity = manifest.get("serving", {}).get("max_context")
    if capacity is not None and len(prompt) + new_tokens - 1 > capacity:
        sys.exit(f"{len(prompt)} prompt and {new_tokens} new tokens exceed the caches' capacity {capacity}")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # TensorScatter warns that it copies the cache (no IOBinding here)
    prefill = ort.InferenceSession(f"{out_dir}/{prefill_spec['file']}", opts, providers=["CPUExecutionProvider"])
    decode = ort.InferenceSession(f"{out_dir}/{decode_spec['file']}", opts, providers=["CPUExecutionProvider"])

    ids = np.array([prompt], dtype=np.int64)  # [B = 1, T]
    feed = {"input_ids": ids}
    if any(i["name"] == "lengths" for i in prefill_spec["inputs"]):  # fixed caches: right-padded prompts
        feed["lengths"] = np.array([len(prompt)], dtype=np.int64)
    outs = prefill.run(None, feed)
    state = {o["state"]: v for o, v in zip(prefill_spec["outputs"], outs) if "state" in o}
    logits, tokens = outs[0], []
    for _ in range(new_tokens):
        token = int(np.argmax(logits[0, -1]))
        tokens.append(token)
        feed = {"input_ids": np.array([[token]], dtype=np.int64)}
        feed.update({i["name"]: state[i["state"]] for i in decode_spec["inputs"] if "state" in i})
        outs = decode.run(None, feed)
        logits = outs[0]
        state = {o["state"]: v for o, v in zip(decode_spec["outputs"], outs) if "state" in o}
    return tokens


def main(argv):
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    out_dir, new_tokens = argv[0], 8
    if "--tokens" in argv:
        new_tokens = int(argv[argv.index("--tokens") + 1])
    prompt = [1, 17, 42, 99, 256, 7, 3, 512]
    tokens = generate(out_dir, prompt, new_tokens)
    print(json.dumps({"prompt": prompt, "generated": tokens}))


if __name__ == "__main__":
    main(sys.argv[1:])
