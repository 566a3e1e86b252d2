"""Training efficiency: model FLOPs, MFU, the device's kernels and precision, the training cost
and time to a target metric (see submodules)."""

from mmtf.perf.flops import FlopCounter, matmul_flops_per_s
from mmtf.perf.monitor import EfficiencyMonitor
from mmtf.perf.target import TimeToTarget

__all__ = ["EfficiencyMonitor", "FlopCounter", "TimeToTarget", "matmul_flops_per_s"]
