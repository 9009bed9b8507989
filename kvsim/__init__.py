"""kvsim: a discrete-event capacity simulator for LLM KV-cache management on home GPUs.

Layers (imports point downward only): config → model → engines → core/policies/latency →
workload → metrics → calibrate/plan/report → cli/api.  See docs/layout.md.
"""

__version__ = "0.2.0"
