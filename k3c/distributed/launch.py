"""The rank process: `python -m k3c.distributed.launch MESH_DIR JOB OUT` (under torchrun, or
spawned by k3c.distributed.spawn) joins the ranks through torch.distributed (gloo on CPU),
loads its rank's artifact and runs the job (its own rows of it with dp): prefill, then decode
steps fed its own state shard.

JOB is a torch.save'd dict {"input_ids": [B, T], "decode_ids": [B, n], "micro_batches": m
(optional, pp: the prefill's pieces of rows)}; OUT/rank{r}.pt gets {"logits", "state",
"decode_logits": [...], "decode_state", "sent", "calls", "timings"} (seconds of prefill and
decode, and of each the part in segments, collectives and pipeline handovers); with pp the
logits are None on a stage before the last and the state is the stage's entries.
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from the environment (as torchrun sets them);
K3C_TIMEOUT_S bounds the rendezvous and every collective.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    from .comm import TorchComm, init_process_group
    from .runner import RankModel, read_manifest
    from .state import local_job

    mesh_dir, job_file, out = argv
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = float(os.environ.get("K3C_TIMEOUT_S", "60"))
    size = read_manifest(mesh_dir)["mesh"]["world"]
    if size != world:  # before the rendezvous: every rank fails at once, none waits
        print(f"rank {rank}: the artifact is a mesh of {size} ranks, the launch has {world}", file=sys.stderr)
        return 1
    init_process_group(rank, world, "env://", timeout)
    try:
        from ..kernels.collectives import using

        model = RankModel(mesh_dir, rank)
        comm = TorchComm(model.mesh.groups())
        job = local_job(torch.load(job_file), model.mesh, rank)  # with dp: the rows of its copy
        with using(comm), torch.no_grad():
            t0 = time.perf_counter()
            logits, state = model.prefill(job["input_ids"], job.get("micro_batches", 1))
            prefill_s = time.perf_counter() - t0
            prefill_parts = dict(model.timings)
            model.timings.clear()
            steps, s = [], state
            t0 = time.perf_counter()
            for i in range(job["decode_ids"].shape[1]):
                lo, s = model.decode(job["decode_ids"][:, i:i + 1], s)
                steps.append(lo)
            decode_s = time.perf_counter() - t0
        result = {"logits": logits, "state": state, "decode_logits": steps, "decode_state": s,
                  "sent": dict(comm.sent), "calls": dict(comm.calls),
                  "timings": {"prefill": prefill_s, "decode": decode_s,
                              "prefill_parts": prefill_parts, "decode_parts": dict(model.timings)}}
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
