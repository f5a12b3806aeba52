"""Tensor types of IR values: a dtype name and a shape of (possibly symbolic) dims."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import dims as D

DTYPES: dict[str, torch.dtype] = {
    "f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
    "i64": torch.int64, "i32": torch.int32, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
FLOATS = frozenset({"f64", "f32", "f16", "bf16"})


def dtype_name(dt: torch.dtype) -> str:
    if dt not in DTYPE_NAMES:
        raise TypeError(f"dtype {dt} has no k3c IR name")
    return DTYPE_NAMES[dt]


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[D.Dim, ...]

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPES)}")
        object.__setattr__(self, "shape", tuple(D.normalize(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def with_shape(self, shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: str) -> TensorType:
        return TensorType(dtype, self.shape)

    def same_as(self, other: TensorType) -> bool:
        return (self.dtype == other.dtype and self.rank == other.rank
                and all(D.equal(a, b) for a, b in zip(self.shape, other.shape)))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(D.to_str(d) for d in self.shape)}]"

    @staticmethod
    def of(t: torch.Tensor) -> TensorType:
        return TensorType(dtype_name(t.dtype), tuple(int(s) for s in t.shape))
