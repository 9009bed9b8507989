"""The host↔device link (PCIe) as one FIFO server per direction (docs/design/DESIGN.md §3.3).

Every KV transfer — an idle session written to host RAM, a restore, a promotion of a
demoted span, a write-back before a drop — occupies one direction of the link for
``latency_s + bytes / bandwidth`` (LinkSpec: pinned, large-copy effective rates).
Transfers in the same direction are served one after the other in request order, so
two simultaneous 1 GiB restores finish after one and two transfer times: concurrent
sessions contend for the link exactly as a ``simpy.Resource(capacity=1)`` with FIFO
queueing would.  While the opposite direction is busy, a transfer runs at
``duplex_factor`` of its rate (LinkSpec; docs/reference/hardware-and-models.md §3).

NOTE: service times are known when a transfer is requested, so the finish time is
computed at once (:meth:`Channel.reserve`) — schedulers and policies, which never
touch SimPy, can price a stall exactly; :func:`transfer` is the same reservation as a
SimPy process for code that runs inside the environment.  A reservation never moves
an earlier one: ``busy_until_s`` only grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from kvsim.config.specs import LinkSpec


@dataclass
class Channel:
    """One direction of the link: a FIFO server with a fixed rate and per-copy latency."""

    name: str
    bytes_per_s: float
    latency_s: float
    duplex_factor: float = 1.0
    busy_until_s: float = 0.0
    busy_s: float = 0.0
    bytes: int = 0
    transfers: int = 0
    other: Channel | None = field(default=None, repr=False)

    def duration_s(self, nbytes: int, start_s: float) -> float:
        rate = self.bytes_per_s
        if self.other is not None and self.other.busy_until_s > start_s:
            rate *= self.duplex_factor
        return self.latency_s + nbytes / rate

    def reserve(self, nbytes: int, now_s: float) -> tuple[float, float]:
        """Queue a copy of ``nbytes`` requested at ``now_s``; return ``(start_s, end_s)``."""
        if nbytes <= 0:
            return now_s, now_s
        start = max(now_s, self.busy_until_s)
        end = start + self.duration_s(nbytes, start)
        self.busy_until_s = end
        self.busy_s += end - start
        self.bytes += int(nbytes)
        self.transfers += 1
        return start, end


class Link:
    """Both directions of one host↔device link (h2d = restore/promote, d2h = offload)."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.h2d = Channel("h2d", spec.h2d_bytes_per_s, spec.latency_s, spec.duplex_factor)
        self.d2h = Channel("d2h", spec.d2h_bytes_per_s, spec.latency_s, spec.duplex_factor)
        self.h2d.other, self.d2h.other = self.d2h, self.h2d

    def channel(self, direction: str) -> Channel:
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction must be h2d or d2h, got {direction!r}")
        return self.h2d if direction == "h2d" else self.d2h

    def summary(self) -> dict[str, float]:
        return {"pcie_h2d_bytes": self.h2d.bytes, "pcie_d2h_bytes": self.d2h.bytes,
                "pcie_h2d_busy_s": self.h2d.busy_s, "pcie_d2h_busy_s": self.d2h.busy_s,
                "pcie_transfers": self.h2d.transfers + self.d2h.transfers}


def transfer(env: simpy.Environment, link: Link, direction: str, nbytes: int):
    """SimPy process body: copy ``nbytes`` over ``link`` and finish when the copy does."""
    _, end = link.channel(direction).reserve(nbytes, env.now)
    if end > env.now:
        yield env.timeout(end - env.now)
    return end
