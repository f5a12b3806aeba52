"""A serving loop over a k3c ONNX artifact with onnxruntime, numpy and the manifest alone:
continuous batching in slots, prefix reuse and speculative verify.

    python examples/serve_loop.py DIR [--slots 2] [--draft-tokens 3]

DIR holds a k3c ONNX artifact with fixed-capacity caches and an extend entry (`k3c compile
--model k3-tiny --backend onnx --max-context 96 --out DIR`). When DIR has no manifest yet,
k3-tiny is compiled into it first: that step alone needs k3c, the loop below does not.

- Prefix reuse: the requests share a prefix. It is prefilled once, as one sequence; each
  request starts from that state (a snapshot: onnxruntime returns new arrays and never writes
  the ones it is given, so the arrays themselves are the snapshot) with an extend of its own
  tokens.
- Slots: the batch state holds every state tensor with one row a slot. A request's state is
  written into a free slot's rows; a finished request is retired and a waiting one takes its
  slot while the others keep decoding.
- Speculative verify: each step, a slot whose last two tokens occurred before, in its own
  sequence or in one served before, proposes up to k draft tokens: the ones that followed
  them there (n-gram drafting; the third request repeats the first's prompt). One extend
  over all slots feeds each slot its current token and its drafts (`lengths`: 1 + drafts, 0
  for a free slot, which then sits the call out) and keeps the longest prefix of drafts equal
  to the model's own greedy choice, plus that choice. A slot that rejected drafts is rolled
  back by a recompute: the state before the verify extended by the kept tokens only (a cache
  row past a sequence's position is never read). A step without drafts runs decode.

Prints one JSON line: each request's prompt and greedy tokens, and the loop's counts.
"""

import json
import sys

import numpy as np
import onnxruntime as ort

MAX_CONTEXT = 96


def compile_k3_tiny(out_dir):
    """The only part that needs k3c: write the artifact."""
    import torch

    import k3c

    model = k3c.models.build("k3-tiny")
    k3c.compile(model, "onnx", (torch.zeros(2, 16, dtype=torch.long),), out_dir=out_dir, max_context=MAX_CONTEXT)


def load(out_dir):
    try:
        with open(f"{out_dir}/manifest.json") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        compile_k3_tiny(out_dir)
        with open(f"{out_dir}/manifest.json") as f:
            manifest = json.load(f)
    entries = manifest.get("entries", {})
    if not {"prefill", "decode", "extend"} <= set(entries) or manifest.get("serving", {}).get("cache") != "fixed":
        sys.exit(f"{out_dir}: not a k3c ONNX artifact with fixed caches and an extend entry (compile with "
                 f"--backend onnx --max-context N)")
    return manifest


class Model:
    """The artifact's entries as numpy functions over a state dict {name: array}."""

    def __init__(self, out_dir, manifest):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3  # TensorScatter warns that it copies the cache (no IOBinding here)
        self.specs = manifest["entries"]
        self.sessions = {e: ort.InferenceSession(f"{out_dir}/{self.specs[e]['file']}", opts,
                                                 providers=["CPUExecutionProvider"])
                         for e in ("prefill", "decode", "extend")}
        self.capacity = manifest["serving"]["max_context"]
        self.calls = {e: 0 for e in self.sessions}

    def _run(self, entry, ids, state=None, lengths=None):
        spec, feed = self.specs[entry], {"input_ids": ids}
        for i in spec["inputs"][1:]:
            feed[i["name"]] = lengths if i["name"] == "lengths" else state[i["state"]]
        outs = self.sessions[entry].run(None, feed)
        self.calls[entry] += 1
        return outs[0], {o["state"]: v for o, v in zip(spec["outputs"], outs) if "state" in o}

    def prefill(self, ids):
        return self._run("prefill", ids, lengths=np.full(ids.shape[0], ids.shape[1], dtype=np.int64))

    def extend(self, ids, state, lengths=None):
        if lengths is None:
            lengths = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
        return self._run("extend", ids, state, lengths)

    def decode(self, ids, state):
        return self._run("decode", ids, state)


def propose(history, corpus, k):
    """Up to k drafts (n-gram drafting): the tokens that followed the latest earlier occurrence
    of the last two tokens, in this sequence or else in a sequence served before."""
    key = history[-2:]
    for seq in [history, *corpus]:
        for i in range(len(seq) - 2, 0, -1):  # seq[i - 1:i + 1] == key with a token after it
            if seq[i - 1:i + 1] == key:
                return seq[i + 1:i + 1 + k]
    return []


def serve(model, prefix, requests, slots, k):
    """Serve `requests` [(suffix, new tokens, arrival step)] in `slots` slots; returns each
    request's greedy tokens, the (slot, step) it was admitted at and the loop's counts."""
    _, prefix_state = model.prefill(np.array([prefix], dtype=np.int64))  # computed once
    batch = {n: np.zeros((slots, *a.shape[1:]), a.dtype) for n, a in prefix_state.items()}
    held = [None] * slots  # request index in each slot
    cur = np.zeros(slots, dtype=np.int64)  # each slot's emitted token, not yet fed
    out = [[] for _ in requests]
    where = [None] * len(requests)  # (slot, step) each request was admitted at
    waiting, step = list(range(len(requests))), 0
    counts = {"steps": 0, "verify_steps": 0, "drafted": 0, "accepted": 0, "most_busy": 0, "rollbacks": 0}
    while waiting or any(r is not None for r in held):
        for s in range(slots):  # admit arrived requests into free slots
            ready = [r for r in waiting if requests[r][2] <= step]
            if held[s] is None and ready:
                r = ready[0]
                waiting.remove(r)
                logits, one = model.extend(np.array([requests[r][0]], dtype=np.int64), prefix_state)
                for n in batch:
                    batch[n][s] = one[n][0]
                held[s], cur[s], where[r] = r, int(np.argmax(logits[0, -1])), (s, step)
                out[r].append(int(cur[s]))
        counts["most_busy"] = max(counts["most_busy"], sum(r is not None for r in held))
        busy = [s for s in range(slots) if held[s] is not None and len(out[held[s]]) < requests[held[s]][1]]
        seen = {r: prefix + requests[r][0] + out[r] for r in range(len(requests)) if out[r]}
        drafts = {s: propose(seen[held[s]], [h for r, h in seen.items() if r != held[s]], k) for s in busy}
        if any(drafts.values()):
            width = 1 + max(len(d) for d in drafts.values())
            fed = np.zeros((slots, width), dtype=np.int64)
            lengths = np.zeros(slots, dtype=np.int64)
            for s in busy:
                fed[s, :1 + len(drafts[s])] = [cur[s], *drafts[s]]
                lengths[s] = 1 + len(drafts[s])
            before = batch
            logits, batch = model.extend(fed, before, lengths)
            choice = logits.argmax(-1)  # [slots, width]: the model's greedy token after each fed one
            keep = np.zeros(slots, dtype=np.int64)
            for s in busy:
                j = 0
                while j < len(drafts[s]) and choice[s, j] == drafts[s][j]:
                    j += 1
                out[held[s]].extend(drafts[s][:j] + [int(choice[s, j])])
                keep[s], cur[s] = j + 1, choice[s, j]
                counts["drafted"] += len(drafts[s])
                counts["accepted"] += j
            if (keep != lengths).any():  # roll back: recompute from the state before the verify
                _, batch = model.extend(fed[:, :int(keep.max())], before, keep)
                counts["rollbacks"] += 1
            counts["verify_steps"] += 1
        elif busy:
            ids = np.zeros((slots, 1), dtype=np.int64)
            ids[busy, 0] = cur[busy]
            logits, batch = model.decode(ids, batch)
            for s in busy:
                cur[s] = int(np.argmax(logits[s, -1]))
                out[held[s]].append(int(cur[s]))
            idle = np.array([s not in busy for s in range(slots)])
            batch["positions"] = np.where(idle, 0, batch["positions"])  # a free row's step is dropped
        for s in range(slots):  # retire finished requests
            if held[s] is not None and len(out[held[s]]) >= requests[held[s]][1]:
                del out[held[s]][requests[held[s]][1]:]
                held[s] = None
                for n in batch:
                    batch[n][s] = 0
        step += 1
    counts["steps"] = step
    return out, where, counts


def main(argv):
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    out_dir, slots, k = argv[0], 2, 3
    if "--slots" in argv:
        slots = int(argv[argv.index("--slots") + 1])
    if "--draft-tokens" in argv:
        k = int(argv[argv.index("--draft-tokens") + 1])
    manifest = load(out_dir)
    model = Model(out_dir, manifest)
    rng = np.random.default_rng(0)
    vocab = manifest["entries"]["prefill"]["inputs"][0].get("bounds", [0, 1024])[1]
    prefix = rng.integers(0, vocab, 24).tolist()
    first = rng.integers(0, vocab, 5).tolist()
    # (own tokens, new tokens, arrival step); the third asks what the first asked: its drafts
    # come from the first's tokens
    requests = [(first, 12, 0), (rng.integers(0, vocab, 9).tolist(), 6, 0), (first, 9, 1)]
    longest = max(len(prefix) + len(r[0]) + r[1] for r in requests) + k
    if longest > model.capacity:
        sys.exit(f"{longest} tokens exceed the caches' capacity {model.capacity}")
    tokens, where, counts = serve(model, prefix, requests, slots, k)
    print(json.dumps({"requests": [{"prompt": prefix + r[0], "generated": t, "slot": w[0], "admitted": w[1]}
                                   for r, t, w in zip(requests, tokens, where)],
                      "calls": model.calls, **counts}))


if __name__ == "__main__":
    main(sys.argv[1:])
