"""Write a tiny random-weights GGUF that a real llama-server can load (end-to-end tests).

A ``llama``-architecture model with grouped-query attention and an SPM ("llama")
vocabulary: ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens ``<0x00>``…``<0xFF>`` and
some word pieces.  Weights are random (seeded), so the text is gibberish, but every
engine mechanism kvsim models — slots, prompt cache, KV cache types, batching — runs
for real and the timings are the engine's own.

NOTE: the byte tokens are ids ``BYTE_IDS`` — replay must ban them with ``logit_bias``:
a lone byte token can be an incomplete UTF-8 sequence that llama-server withholds from
the stream, which would merge two tokens into one streamed event.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPECIAL = ("<unk>", "<s>", "</s>")
BYTE_IDS = range(len(SPECIAL), len(SPECIAL) + 256)


@dataclass(frozen=True)
class TinyLlama:
    layers: int = 6
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    pieces: int = 765
    context: int = 8192
    seed: int = 0

    @property
    def vocab(self) -> int:
        return len(SPECIAL) + 256 + self.pieces

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def piece_ids(self) -> range:
        """Ids of the ordinary word pieces (what replay's token space should use)."""
        return range(len(SPECIAL) + 256, self.vocab)


def _vocab(cfg: TinyLlama) -> tuple[list[str], list[float], list[int]]:
    import gguf

    tokens = list(SPECIAL) + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    for i in range(cfg.pieces):
        a, b = divmod(i, 26)
        tokens.append("\u2581" + letters[a % 26] + letters[b] + str(a // 26 or ""))
        types.append(gguf.TokenType.NORMAL)
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(i) for i in range(cfg.pieces)]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: str | Path, cfg: TinyLlama = TinyLlama()) -> Path:
    """Write the model to ``path`` (atomically) and return it."""
    import gguf

    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    rng = np.random.default_rng(cfg.seed)
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("kvsim-tiny-llama")
    w.add_context_length(cfg.context)
    w.add_embedding_length(cfg.hidden)
    w.add_block_count(cfg.layers)
    w.add_feed_forward_length(cfg.ffn)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_head_count(cfg.heads)
    w.add_head_count_kv(cfg.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = _vocab(cfg)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

    def t(name: str, *shape: int) -> None:
        arr = rng.standard_normal(shape).astype(np.float32) * shape[-1] ** -0.5
        w.add_tensor(name, arr)

    h, hd = cfg.hidden, cfg.head_dim
    t("token_embd.weight", cfg.vocab, h)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    t("output.weight", cfg.vocab, h)
    for i in range(cfg.layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", cfg.heads * hd, h)
        t(f"blk.{i}.attn_k.weight", cfg.kv_heads * hd, h)
        t(f"blk.{i}.attn_v.weight", cfg.kv_heads * hd, h)
        t(f"blk.{i}.attn_output.weight", h, cfg.heads * hd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, dtype=np.float32))
        t(f"blk.{i}.ffn_gate.weight", cfg.ffn, h)
        t(f"blk.{i}.ffn_up.weight", cfg.ffn, h)
        t(f"blk.{i}.ffn_down.weight", h, cfg.ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(p)
    return p
