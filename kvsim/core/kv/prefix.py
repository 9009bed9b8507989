"""Chained prefix hashes over full KV blocks (vLLM automatic prefix caching, §1.3).

Block *i*'s key is ``hash(key of block i−1, pieces of block i)`` where the pieces are
the ``(content id, start, end)`` runs of the block's tokens — the simulator's stand-in
for token ids.  Chaining means a hit on block *i* implies blocks ``0..i−1`` match,
so a lookup walks from the start and stops at the first miss.  Only full blocks are
hashed; a trailing partial block is never cached.

A block inside one piece ``(sid, a, a + block)`` — most blocks: a long segment, an
answer — is keyed ``hash((parent, sid, a))``, a block spanning several pieces
``hash((parent, pieces))``: the two shapes never compare equal, and with the block
size fixed ``(sid, a)`` names the single piece, so keys are equal exactly when the
pieces are (one flat tuple a block instead of three nested ones: ~3x cheaper).

NOTE: keys use Python's tuple hash (64-bit); string hashing is salted per process,
but only key *equality* matters to the simulation, so results do not depend on it.
"""

from __future__ import annotations

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


def extend_block_hashes(hashes: list[int], seq: TokenSeq, block_tokens: int,
                        num_blocks: int) -> list[int]:
    """Extend ``hashes`` (in place) to the first ``num_blocks`` full blocks of ``seq``.

    NOTE: a block that lies inside one piece is keyed by that single piece, exactly as
    the general split gives it; such runs of blocks (most of a long segment) take a
    tight loop instead of the split.
    """
    k = len(hashes)
    if num_blocks <= k:
        return hashes
    parent: int | None = hashes[-1] if hashes else None
    append = hashes.append
    bt = block_tokens
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
            append(parent)
            cur, filled = [], 0
        whole_end = s + (e - s) // bt * bt
        for a in range(s, whole_end, bt):  # blocks inside this piece (module doc)
            parent = hash((parent, sid, a))
            append(parent)
        if whole_end < e:
            cur, filled = [(sid, whole_end, e)], e - whole_end
    return hashes


def extend_tail_hashes(hashes: list[int], piece_id: str, piece_start: int, offset: int,
                       block_tokens: int, num_blocks: int) -> list[int]:
    """:func:`extend_block_hashes` when every new block lies inside the sequence's last
    piece ``(piece_id, piece_start, ...)`` and block ``len(hashes)`` starts ``offset``
    tokens into it (a decoding request's output): the same keys, no piece walk.

    NOTE: inside one piece the generic split keys each block ``(parent, piece_id, a)``
    (module doc), so the keys are equal by construction.
    """
    parent: int | None = hashes[-1] if hashes else None
    first = piece_start + offset
    append = hashes.append
    for a in range(first, first + (num_blocks - len(hashes)) * block_tokens, block_tokens):
        parent = hash((parent, piece_id, a))
        append(parent)
    return hashes


def block_hashes(seq: TokenSeq, block_tokens: int) -> list[int]:
    """Hashes of every full block of ``seq``."""
    n = sum(e - s for _, s, e in seq) // block_tokens
    return extend_block_hashes([], seq, block_tokens, n)
