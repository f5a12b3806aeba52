"""Running a model split over a mesh of ranks:

- mesh.py: the mesh (tp, ep, dp axes, groups, which shapes the runtime runs);
- partition.py, partition_zoo.py: one rank's part of a model, cut on its nn.Module tree
  before capture (the Kimi family; the zoo's GPT-2 and linear-attention models on tp);
- comm.py: the communicators (torch.distributed in rank processes, the simulator's threads);
- state.py: a one-process state split into rank shards and joined back;
- simulate.py: every rank of a partitioned program in this process, in lockstep;
- segments.py: a rank's graph cut at its collectives, for backends that lower no collective;
- pipeline.py: a rank's graph cut to its pipeline stage's layers (pp), and what it receives
  from the stage before and sends to the next;
- runner.py, launch.py, spawn.py: per-rank artifacts, the rank process (under torchrun or
  spawned), and the spawning with timeouts that `k3c diff --mesh` uses.
"""
