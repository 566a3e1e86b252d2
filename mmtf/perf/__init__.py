"""Training efficiency: model FLOPs, MFU, the device's kernels and precision (see submodules)."""

from mmtf.perf.flops import FlopCounter, matmul_flops_per_s
from mmtf.perf.monitor import EfficiencyMonitor

__all__ = ["EfficiencyMonitor", "FlopCounter", "matmul_flops_per_s"]
