"""What each accelerator is worth relative to the reference A100-40GB, and its memory.

Work in a job spec is measured in reference GPU-hours on an A100-40GB; a job's speed on
another accelerator is the ratio below. The rule is the same for every row so it can be
checked: training speed = peak dense BF16/FP16 tensor TFLOPS / 312 (the A100's), and
inference speed = memory bandwidth / 1,555 GB/s (decoding is bandwidth-bound). These are
peak ratios from the vendors' datasheets; a job that measured its own rate should give
`work.steps_per_hour` instead.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from broker.domain.errors import SpecError

REFERENCE = "A100"


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_gb: float
    tflops: float  # peak dense BF16/FP16 tensor TFLOPS (FP32 where no tensor cores)
    bandwidth_gbps: float  # memory bandwidth, GB/s

    @property
    def training_speed(self) -> float:
        return round(self.tflops / ACCELERATORS[REFERENCE].tflops, 3)

    @property
    def inference_speed(self) -> float:
        return round(self.bandwidth_gbps / ACCELERATORS[REFERENCE].bandwidth_gbps, 3)

    def speed(self, kind: str) -> float:
        """Throughput relative to an A100-40GB for `training` or `inference` work."""
        return self.inference_speed if kind == "inference" else self.training_speed


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in [
        # NVIDIA A100 Tensor Core GPU datasheet (SXM): 312 TFLOPS BF16, 1,555 / 2,039 GB/s.
        Accelerator("A100", 40, 312, 1555),
        Accelerator("A100-80GB", 80, 312, 2039),
        # NVIDIA H100 datasheet (SXM5): 989 TFLOPS BF16 dense (1,979 with sparsity), 3.35 TB/s.
        Accelerator("H100", 80, 989, 3350),
        # GCP a3-megagpu-8g: the same H100 SXM 80GB, with more network bandwidth per VM.
        Accelerator("H100-MEGA", 80, 989, 3350),
        # NVIDIA H200 datasheet: H100 compute with 141 GB HBM3e at 4.8 TB/s.
        Accelerator("H200", 141, 989, 4800),
        # NVIDIA L40S datasheet: 362 TFLOPS BF16 dense (733 with sparsity), 864 GB/s.
        Accelerator("L40S", 48, 362, 864),
        # NVIDIA L4 datasheet: 121 TFLOPS BF16 dense (242 with sparsity), 300 GB/s.
        Accelerator("L4", 24, 121, 300),
        # NVIDIA A10 datasheet: 125 TFLOPS BF16 dense (250 with sparsity), 600 GB/s.
        Accelerator("A10", 24, 125, 600),
        # AWS A10G (g5): AWS publishes no TFLOPS; about 70 TFLOPS FP16 dense is the figure
        # commonly reported for its lower clocks; 600 GB/s GDDR6 like the A10.
        Accelerator("A10G", 24, 70, 600),
        # NVIDIA T4 datasheet: 65 TFLOPS FP16 mixed precision, 320 GB/s. g5g's T4g is a T4.
        Accelerator("T4", 16, 65, 320),
        Accelerator("T4g", 16, 65, 320),
        # NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor, 900 GB/s; 16 or 32 GB.
        Accelerator("V100", 16, 125, 900),
        Accelerator("V100-32GB", 32, 125, 900),
        # NVIDIA P100 datasheet (PCIe 16 GB): 18.7 TFLOPS FP16, 732 GB/s.
        Accelerator("P100", 16, 18.7, 732),
        # NVIDIA P4 datasheet: 5.5 TFLOPS FP32 (no fast FP16), 192 GB/s.
        Accelerator("P4", 8, 5.5, 192),
        # NVIDIA K80 datasheet: 8.73 TFLOPS FP32 and 480 GB/s per board of two GPUs.
        Accelerator("K80", 12, 4.37, 240),
        # NVIDIA M60 datasheet: 9.6 TFLOPS FP32 and 320 GB/s per board of two GPUs.
        Accelerator("M60", 8, 4.8, 160),
    ]
}

_BY_LOWER = {name.lower(): name for name in ACCELERATORS}


def lookup(name: str) -> Accelerator:
    """The accelerator called `name` (case-insensitive), or a SpecError suggesting close names."""
    canonical = _BY_LOWER.get(name.strip().lower())
    if canonical:
        return ACCELERATORS[canonical]
    close = difflib.get_close_matches(name.upper(), list(ACCELERATORS), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(ACCELERATORS)}"
    raise SpecError(f"unknown accelerator {name!r}; {hint}")
