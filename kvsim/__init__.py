"""kvsim: a discrete-event capacity simulator for LLM KV-cache management on home GPUs.

Layers (imports point downward only): config → model → core/policies/latency →
workload → metrics → calibrate/plan/report → cli/api.  See docs/design/DESIGN.md.
"""

__version__ = "0.2.0"
