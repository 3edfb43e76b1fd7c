"""A GPU's dense bf16 tensor-core peak, by the name CUDA reports for it.

The share of peak a benchmark prints is only as true as this figure. NVIDIA's datasheets give
bf16 throughput "with sparsity" (2:4 structured sparsity), twice the dense rate that an embedding
model's GEMMs can reach; every figure below is the dense one, the datasheet's sparse figure halved
where only that is printed. The first device check divided by 790 TFLOP/s, a rough H200 figure,
and overstated every share by a quarter (docs/benchmarks/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Peak:
    #: dense bf16 TFLOP/s
    tflops: float
    #: what the figure is, for the report
    label: str


# Matched in order on the lower-cased device name (torch.cuda.get_device_name()); the more
# specific names first ("h200 nvl" before "h200", "h100 pcie" before "h100").
PEAKS: tuple[tuple[str, Peak], ...] = (
    # NVIDIA H200 datasheet: NVL 1,671 TFLOPS bf16 with sparsity.
    ("h200 nvl", Peak(835.5, "H200 NVL dense bf16")),
    # NVIDIA H200 datasheet: SXM 1,979 TFLOPS bf16 with sparsity. CUDA names the SXM part
    # "NVIDIA H200".
    ("h200", Peak(989.5, "H200 SXM dense bf16")),
    # NVIDIA H100 datasheet: NVL 1,671, PCIe 1,513, SXM 1,979 TFLOPS bf16 with sparsity. CUDA
    # names the SXM part "NVIDIA H100 80GB HBM3".
    ("h100 nvl", Peak(835.5, "H100 NVL dense bf16")),
    ("h100 pcie", Peak(756.5, "H100 PCIe dense bf16")),
    ("h100", Peak(989.5, "H100 SXM dense bf16")),
    # NVIDIA H800 and GH200 share the H100 SXM's tensor cores and clocks in their datasheets.
    ("gh200", Peak(989.5, "GH200 dense bf16")),
    # NVIDIA A100 datasheet: 312 TFLOPS bf16 dense (624 with sparsity), SXM and PCIe alike.
    ("a100", Peak(312.0, "A100 dense bf16")),
    # NVIDIA L40S datasheet: 733 TFLOPS bf16 with sparsity.
    ("l40s", Peak(366.5, "L40S dense bf16")),
    # NVIDIA L40 datasheet: 362.1 TFLOPS bf16 with sparsity.
    ("l40", Peak(181.05, "L40 dense bf16")),
    # NVIDIA L4 datasheet: 242 TFLOPS bf16 with sparsity.
    ("l4", Peak(121.0, "L4 dense bf16")),
    # NVIDIA A10 datasheet: 250 TFLOPS bf16 with sparsity.
    ("a10", Peak(125.0, "A10 dense bf16")),
)


def dense_bf16_peak(device_name: str) -> Peak | None:
    """The dense bf16 peak of the GPU CUDA calls `device_name`; None for one not in PEAKS (the
    report then prints no share rather than a wrong one)."""
    name = device_name.lower()
    for pattern, peak in PEAKS:
        if pattern in name:
            return peak
    return None
