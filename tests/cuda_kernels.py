"""What onnxruntime's CUDA provider has kernels for, as its docs/OperatorKernels.md lists them
(CUDAExecutionProvider section): the reference the ONNX tests check artifacts against, copied
from the document, not from k3c."""

from __future__ import annotations

# op -> first opset of the CUDA provider's kernel whose inputs include tensor(bfloat16):
# Cast "13+" (and "[13, 18]": T1 has bfloat16), MatMul "13+" (T = bfloat16, double, float,
# float16; its [9, 12] and [1, 8] rows have no bfloat16), Gather "13+" (T has bfloat16 in every
# row; 13 is the first of the opsets k3c's artifacts import)
CUDA_TAKES_BF16 = {"Cast": 13, "MatMul": 13, "Gather": 13}
