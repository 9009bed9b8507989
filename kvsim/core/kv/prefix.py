"""Chained prefix keys over full KV blocks (vLLM automatic prefix caching, §1.3).

Block *i*'s key is a function of the key of block i−1 and block *i*'s *descriptor*: the
``(content id, start, end)`` pieces of its tokens — the simulator's stand-in for token
ids.  Chaining means a hit on block *i* implies blocks ``0..i−1`` match, so a lookup
walks from the start and stops at the first miss.  Only full blocks are keyed; a
trailing partial block is never cached.

Keys come per *run*: most blocks lie inside one piece ``(sid, a, a + block)`` — a long
segment, an answer — and a block inside one piece right after the block before it in
the same piece (``(sid, a − block)``) *continues* the run: its key is the previous key
plus ``RUN_STEP`` (mod 2⁶⁴), no hash computed.  Any other block starts a run: one
inside one piece is keyed ``hash((parent, sid, a))``, one spanning several pieces
``hash((parent, pieces))`` (the two shapes never compare equal).  Whether a block
continues a run depends on its own descriptor and its predecessor's, both part of the
chain, so keys are equal exactly when the descriptors of every block up to them are
(up to 64-bit collisions), as a hash of each block's descriptor would give; and block
``k`` of a run is ``run key + k · RUN_STEP``, which an index of runs can use.

NOTE: keys use Python's tuple hash (64-bit); string hashing is salted per process,
but only key *equality* matters to the simulation, so results do not depend on it.
"""

from __future__ import annotations

import numpy as np

from kvsim.core.requests import Piece, TokenSeq


def pieces_in_range(seq: TokenSeq, start: int, end: int) -> list[Piece]:
    """The pieces of ``seq`` covering token positions ``[start, end)``."""
    out: list[Piece] = []
    pos = 0
    for sid, s, e in seq:
        n = e - s
        lo, hi = max(start - pos, 0), min(end - pos, n)
        if lo < hi:
            out.append((sid, s + lo, s + hi))
        pos += n
        if pos >= end:
            break
    return out


RUN_STEP = 0x9E3779B97F4A7C15  # NOTE: odd, so k · RUN_STEP (mod 2⁶⁴) differs for every k
_MASK = (1 << 64) - 1
_NUMPY_RUN = 48  # NOTE: longer runs are keyed with one numpy pass (its set-up ~5 µs)


def run_keys(key: int, n: int) -> list[int]:
    """The keys of the ``n`` blocks that continue a run after the block keyed ``key``."""
    if n < _NUMPY_RUN:
        return [(key + k * RUN_STEP) & _MASK for k in range(1, n + 1)]
    steps = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(RUN_STEP)
    return (steps + np.uint64(key & _MASK)).tolist()  # NOTE: uint64 wraps mod 2⁶⁴


def extend_block_hashes(hashes: list[int], seq: TokenSeq, block_tokens: int,
                        num_blocks: int) -> list[int]:
    """Extend ``hashes`` (in place) to the keys of the first ``num_blocks`` full blocks
    of ``seq`` (module doc).

    NOTE: ``prev`` is the descriptor ``(sid, a)`` of the last keyed block when it lies
    inside one piece, else ``None``: a block inside one piece continues the run exactly
    when ``prev`` is its own descriptor one block back.
    """
    k = len(hashes)
    if num_blocks <= k:
        return hashes
    bt = block_tokens
    parent: int | None = hashes[-1] if hashes else None
    prev: tuple[str, int] | None = None
    if k:
        before = pieces_in_range(seq, (k - 1) * bt, k * bt)
        if len(before) == 1:
            prev = (before[0][0], before[0][1])
    cur: list[Piece] = []  # the pieces of the block being filled
    filled = 0
    for sid, s, e in pieces_in_range(seq, k * bt, num_blocks * bt):
        if filled:  # complete the block a previous piece started
            take = min(e - s, bt - filled)
            cur.append((sid, s, s + take))
            s += take
            filled += take
            if filled < bt:
                continue
            parent = hash((parent, tuple(cur)))
            hashes.append(parent)
            cur, filled, prev = [], 0, None
        n = (e - s) // bt  # whole blocks inside this piece
        if n:
            if prev == (sid, s - bt):  # every one of them continues the run
                hashes += run_keys(parent, n)  # type: ignore[arg-type]
            else:  # NOTE: the run starts at the first
                hashes.append(hash((parent, sid, s)))
                if n > 1:
                    hashes += run_keys(hashes[-1], n - 1)
            parent = hashes[-1]
            s += n * bt
            prev = (sid, s - bt)
        if s < e:
            cur, filled = [(sid, s, e)], e - s
    return hashes


def extend_tail_hashes(hashes: list[int], piece_id: str, piece_start: int, offset: int,
                       block_tokens: int, num_blocks: int) -> list[int]:
    """:func:`extend_block_hashes` when every new block lies inside the sequence's last
    piece ``(piece_id, piece_start, ...)`` and block ``len(hashes)`` starts ``offset``
    tokens into it (a decoding request's output): the same keys, no piece walk.

    NOTE: the block before lies inside this piece exactly when ``offset ≥ block``; a
    caller guarantees no earlier piece continues this one (``piece_start`` 0: an
    output's own id).
    """
    n = num_blocks - len(hashes)
    if n <= 0:
        return hashes
    if offset < block_tokens:  # the run starts at this block (module doc)
        parent = hash((hashes[-1] if hashes else None, piece_id, piece_start + offset))
        hashes.append(parent)
        n -= 1
    if n:
        hashes += run_keys(hashes[-1], n)
    return hashes


def block_hashes(seq: TokenSeq, block_tokens: int) -> list[int]:
    """Hashes of every full block of ``seq``."""
    n = sum(e - s for _, s, e in seq) // block_tokens
    return extend_block_hashes([], seq, block_tokens, n)
