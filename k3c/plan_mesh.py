"""The mesh a deployment plan is written for: dp, tp, ep and pp axes over GPUs.

    tp  splits the attention heads (KDA, MLA), the dense and shared-expert MLP widths and every
        routed expert's columns, as k3c/distributed/partition.py does;
    ep  splits the routed experts; it lies over the dp axis, one of the two dividing the other:
        with dp >= ep a stage has tp * dp ranks, each block of ep copies holds every expert
        once (E / ep a copy, its columns over tp) and the expert shards are copied dp / ep
        times; with ep > dp (dp = 1 included) a stage has tp * ep ranks and the attention is
        copied ep / dp times over ranks that see the same sequences;
    dp  copies the attention per group of tp ranks, each copy with its own sequences (the
        "data-parallel attention" of DEP: dp=16,ep=16 is 16 GPUs);
    pp  splits the layers into pp stages of consecutive layers, one stage per group of ranks.

So a stage holds tp * max(dp, ep) ranks and the world is pp times that; the layout is the
runtime's (distributed.mesh.Mesh, which `runtime()` gives). The runtime runs every shape
without pp, and pp with tp alone; k3c plan counts the runs without pp on the partitioned
model, and prices pp (whose stage handover the runtime's gloo runs match) and pp with ep or
dp, which is plan-only, by arithmetic.

    DeployMesh.parse("dp=16,ep=16").world == 16;  DeployMesh.parse("tp=8,ep=16").world == 128
"""

from __future__ import annotations

from dataclasses import dataclass

from .distributed.mesh import Mesh, parse_axes, stage_layers
from .errors import UsageError

AXES = ("dp", "tp", "ep", "pp")


@dataclass(frozen=True)
class DeployMesh:
    dp: int = 1
    tp: int = 1
    ep: int = 1
    pp: int = 1
    vocab: bool = False

    def __post_init__(self):
        for axis in AXES:
            n = getattr(self, axis)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise UsageError(f"mesh: {axis} must be a whole number >= 1, got {n!r}")
        if max(self.dp, self.ep) % min(self.dp, self.ep):
            raise UsageError(f"mesh {self}: ep lies over the dp ranks, so one of dp={self.dp} and "
                             f"ep={self.ep} must divide the other")
        if self.vocab and self.tp == 1:
            raise UsageError(f"mesh {self}: 'vocab' splits the vocabulary over tp, and tp is 1")

    @staticmethod
    def parse(text: str | DeployMesh | Mesh) -> DeployMesh:
        """"dp=16,ep=16", "tp=8,ep=16,vocab", "tp=8,pp=2" (an axis left out is 1)."""
        if isinstance(text, DeployMesh):
            return text
        if isinstance(text, Mesh):
            return DeployMesh(tp=text.tp, ep=text.ep, vocab=text.vocab, dp=text.dp, pp=text.pp)
        sizes, vocab = parse_axes(text, AXES)
        return DeployMesh(**sizes, vocab=vocab)

    @property
    def stage_ranks(self) -> int:
        return self.tp * max(self.dp, self.ep)

    @property
    def world(self) -> int:
        return self.pp * self.stage_ranks

    @property
    def expert_split(self) -> int:
        """Ways each MoE layer's routed expert bytes are split: the tp * ep ranks of an expert
        group (the stage but with dp > ep, where the groups hold copies of each other)."""
        return self.tp * self.ep

    @property
    def expert_tokens(self) -> int:
        """How many dp copies' tokens reach one expert group: min(dp, ep)."""
        return min(self.dp, self.ep)

    @property
    def token_peers(self) -> int:
        """Ranks of an expert group that hold the same tokens (the runtime's Mesh.token_peers)."""
        return self.stage_ranks // self.dp

    def runtime(self) -> Mesh | None:
        """The runtime mesh that lays out the ranks alike, or None where the mesh is plan-only."""
        runs = self.pp == 1 or max(self.dp, self.ep) == 1
        return Mesh(self.tp, self.ep, self.vocab, self.dp, self.pp) if runs else None

    @property
    def plan_only(self) -> bool:
        return self.runtime() is None

    def stages(self, layers: int) -> list[range]:
        """The layers of each stage: consecutive, as even as they go."""
        if self.pp > layers:
            raise UsageError(f"mesh {self}: pp={self.pp} stages for {layers} layers")
        return stage_layers(layers, self.pp)

    def to_json(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "world": self.world, "vocab": self.vocab,
                "dp": self.dp, "pp": self.pp, "plan_only": self.plan_only}

    def __str__(self) -> str:
        axes = ",".join(f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1) or "tp=1"
        return axes + (",vocab" if self.vocab else "")


def check_divides(mesh: DeployMesh, config) -> None:
    """The runtime's divisibility checks (heads, widths, experts) for the tp and ep splits."""
    from .distributed.mesh import check_divides as runtime_check

    runtime_check(Mesh(mesh.tp, mesh.ep, mesh.vocab), config)
