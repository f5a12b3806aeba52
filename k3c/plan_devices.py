"""The accelerators `k3c plan --device` knows: memory, bandwidths and dense peak FLOPs of one GPU.

Figures are the vendor's datasheet numbers for one GPU (a platform's figure divided by its GPU
count where the datasheet gives only the platform's), dense (no 2:4 sparsity), in SI units
(1 GB = 1e9 bytes, 1 TB/s = 1e12 bytes/s). NVLink is quoted by NVIDIA as the total of both
directions; a rank sends and receives at once, so the plan prices what it sends at half of it.

    device("gb300").hbm_bytes_per_s  -> 8e12

The figures and their sources are the DEVICES table below; `device_table()` prints them as
markdown (BENCHMARKS.md shows it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UsageError

HEADROOM = 0.10
"""The share of a device's memory the plan leaves to activations, workspaces, the CUDA context
and the communication buffers: weights and state must fit in the rest."""


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # both directions, as the datasheet quotes it
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float | None  # None: no FP4 tensor cores (the MXFP4 experts run at the FP8 rate at best)
    source: str

    @property
    def send_bytes_per_s(self) -> float:
        """What one GPU can send while it receives as much: one direction of its NVLink."""
        return self.nvlink_bytes_per_s / 2

    @property
    def expert_flops(self) -> float:
        """The peak the MXFP4 routed experts' GEMMs can reach: FP4, else FP8 (dequantised)."""
        return self.fp4_flops or self.fp8_flops

    def to_json(self) -> dict:
        return asdict(self)


G, T, P = 1e9, 1e12, 1e15
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("h200", 141 * G, 4.8 * T, 900 * G, 989e12, 1979e12, None,
           "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
    Device("b200", 180 * G, 8 * T, 1.8 * T, 2.25 * P, 4.5 * P, 9 * P,
           "NVIDIA HGX B200 / DGX B200 datasheet (per GPU: 1.44 TB and 72 PF dense FP4 over 8 GPUs)"),
    Device("gb300", 288 * G, 8 * T, 1.8 * T, 2.5 * P, 5 * P, 15 * P,
           "NVIDIA GB300 NVL72 datasheet (per GPU: the rack's 576 TB/s, 130 TB/s NVLink, 1080 PF dense FP4 over 72)"),
    Device("b300", 288 * G, 8 * T, 1.8 * T, 2.25 * P, 4.5 * P, 13.5 * P,
           "NVIDIA HGX B300 datasheet (per GPU: 2.3 TB and 108 PF dense FP4 over 8 GPUs)"),
)}


def device(name: str) -> Device:
    """The device called `name` (h200, b200, gb300, b300); a UsageError naming the known ones."""
    key = str(name).lower()
    if key not in DEVICES:
        raise UsageError(f"device {name!r} is not known to the plan; known: {', '.join(DEVICES)}")
    return DEVICES[key]


def device_table() -> str:
    """The markdown table of the devices, their figures and sources (BENCHMARKS.md prints it)."""
    rows = ["| device | memory | HBM | NVLink (both ways) | dense BF16 | dense FP8 | dense FP4 | source |",
            "|---|---|---|---|---|---|---|---|"]
    for d in DEVICES.values():
        fp4 = f"{d.fp4_flops / P:g} PFLOPS" if d.fp4_flops else "none"
        rows.append(f"| {d.name} | {d.memory_bytes / G:g} GB | {d.hbm_bytes_per_s / T:g} TB/s | "
                    f"{d.nvlink_bytes_per_s / T:g} TB/s | {d.bf16_flops / P:g} PFLOPS | {d.fp8_flops / P:g} PFLOPS | "
                    f"{fp4} | {d.source} |")
    return "\n".join(rows)
