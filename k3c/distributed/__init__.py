"""Running a model split over a mesh of ranks (passes/partition.py makes each rank's part):

- comm.py: the communicators (torch.distributed in rank processes, the simulator's threads);
- state.py: a one-process state split into rank shards and joined back;
- simulate.py: every rank of a partitioned program in this process, in lockstep;
- segments.py: a rank's graph cut at its collectives, for backends that lower no collective;
- runner.py, launch.py, spawn.py: per-rank artifacts, the rank process (under torchrun or
  spawned), and the spawning with timeouts that `k3c diff --mesh` uses.
"""
