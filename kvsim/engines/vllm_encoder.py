"""vLLM's profiling pass over a vision-language checkpoint's image encoder
(docs/reference/engines.md §1.11): how many dummy images it encodes, the activation peak
that leaves, and the encoder outputs it keeps while the language model's dummy batch runs.

vLLM V1 (``GPUModelRunner.profile_run``, ``MultiModalBudget``, vllm-project/vllm) sizes
the pass from the modality with the most tokens per item:

- the encoder budget is ``max(max_num_batched_tokens, T)``, ``T`` the processor's largest
  image in language-model tokens (``compute_mm_encoder_budget``);
- it encodes ``max(1, min(budget // T, max_num_seqs × max(1, min(limit, max_model_len //
  T))))`` images of that size (``_get_max_items``; ``limit_mm_per_prompt`` defaults to 999
  an item kind), one batch through the encoder, then keeps the outputs in the encoder
  cache while ``_dummy_run`` pushes ``max_num_batched_tokens`` through the language model.

So the profiled peak is the larger of the encoder's forward and the language model's dummy
batch beside the cached outputs.  Start-up logs of the Qwen3.5-family encoder
(Qwen3.8-27B on vLLM 2026 builds: "Encoder cache will be initialized with a budget of
16384 tokens, and profiled with 1 image items of the maximum feature size",
noonghunna/club-3090 issues #1047 and #1107) show the rule's outcome for ``T`` = 16,384.

The encoder's forward is eager (``compile_mm_encoder`` off by default): ESTIMATE of its
peak per image patch, 16-bit activations (flash attention, so nothing grows with the
square of a sequence):

- the residual stream and the norm output handed to the MLP (``2 × H``), the first MLP
  projection's output and its activation (``2 × I / tp``; a gated MLP's fused gate/up
  projection and its product, ``3 × I / tp``): the MLP is wider than the attention's
  Q/K/V and rotary copies for every encoder sized here;
- the processor's pixel values, float32 (``4 × channels × temporal patch × patch²``
  bytes), held by the dummy batch for the whole pass.

With tensor parallelism the encoder's layers are split like the language model's
(``mm_encoder_tp_mode`` ``weights``): the MLP's width is ``1/tp`` on each rank, the hidden
states and pixels whole.  vLLM's V0 engine (before 0.8.0) ran its images inside the
dummy sequences instead; kvsim does not size that.

Not sized either: a family whose largest item is a video (``VisionEncoder.video_largest``).
For Qwen2-VL processing (Qwen2.5-VL) vLLM's dummy video takes as many frames as fit in
``max_model_len`` (``_get_max_video_frames``, up to ``_MAX_FRAMES_PER_VIDEO`` 600), so its
pass grows with the context: vllm-project/vllm PR #25631 measured 5.26 GiB of KV cache for
Qwen2.5-VL-3B on an A100-40GB by default and 25.05 GiB with ``--limit-mm-per-prompt
'{"image": 1, "video": 0}'``. This module's per-patch estimate, for the 14-frame
video of 114,688 tokens that 128,000 tokens of context hold, accounts for 11 GiB of that
20 GiB difference: too far off to ship.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.engines.vllm_releases import vllm_release
from kvsim.model.vision import patches_per_image, vision_bytes

if TYPE_CHECKING:
    from kvsim.config.specs import ModelSpec, VisionEncoder
    from kvsim.engines.config import PagedEngineConfig

ACTIVATION_BYTES = 2
"""The encoder runs in the checkpoint's 16-bit dtype."""
PIXEL_BYTES = 4
"""The image processor's pixel values are float32."""
LIMIT_PER_PROMPT = 999
"""vLLM's default ``limit_mm_per_prompt`` for each item kind."""


@dataclass(frozen=True)
class EncoderPass:
    """The profiling pass's encoder batch: ``items`` images of ``tokens_per_item``
    language-model tokens each, ``budget_tokens`` the encoder cache's budget."""

    items: int
    tokens_per_item: int
    budget_tokens: int

    @property
    def tokens(self) -> int:
        return self.items * self.tokens_per_item

    def log_line(self) -> str:
        """What vLLM prints of it."""
        return (f"Encoder cache will be initialized with a budget of {self.budget_tokens} "
                f"tokens, and profiled with {self.items} image items of the maximum "
                "feature size.")


def encoder_pass(model: ModelSpec, engine: PagedEngineConfig) -> EncoderPass | None:
    """The dummy image batch vLLM V1 encodes at start-up (module doc); None for a text
    model, an encoder whose largest image is not known or whose largest item is a video,
    ``--language-model-only`` or the V0 engine."""
    v = model.vision_encoder
    if v is None or not v.max_image_tokens or v.video_largest \
            or engine.language_model_only or vllm_release(engine.version).engine != "V1":
        return None
    t = v.max_image_tokens
    budget = max(engine.max_num_batched_tokens, t)
    per_prompt = max(1, min(LIMIT_PER_PROMPT, engine.context_tokens // t))
    items = max(1, min(budget // t, engine.max_num_seqs * per_prompt))
    return EncoderPass(items, t, budget)


def loaded_vision_bytes(model: ModelSpec, engine: PagedEngineConfig) -> int:
    """The image encoder's bytes the engine loads: none with ``--language-model-only``
    (vLLM builds no encoder when every item kind's limit is 0)."""
    return 0 if engine.language_model_only else vision_bytes(model)


def patch_peak_bytes(v: VisionEncoder, tp: int = 1) -> int:
    """ESTIMATE of the encoder forward's live bytes per image patch on one of ``tp``
    ranks (module doc)."""
    mlp = (3 if v.gated_mlp else 2) * v.intermediate_size // tp
    pixels = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    return ACTIVATION_BYTES * (2 * v.hidden_size + mlp) + PIXEL_BYTES * pixels


def encoder_peak_bytes(model: ModelSpec, p: EncoderPass, tp: int = 1) -> int:
    """The encoder forward's peak over the pass's images, on one of ``tp`` ranks."""
    v = model.vision_encoder
    assert v is not None
    return p.items * patches_per_image(v) * patch_peak_bytes(v, tp)


def encoder_cache_bytes(model: ModelSpec, p: EncoderPass) -> int:
    """The encoder outputs kept (whole on every rank) while the language model's dummy
    batch runs: one language-model-wide 16-bit vector per image token."""
    v = model.vision_encoder
    assert v is not None
    return p.tokens * v.out_hidden_size * ACTIVATION_BYTES


def with_encoder_pass(lm_bytes: int, model: ModelSpec, p: EncoderPass | None,
                      tp: int = 1) -> int:
    """The profiled activation peak on a rank that runs the encoder pass ``p``
    (:func:`encoder_pass`): the larger of the encoder's forward and ``lm_bytes`` (the
    language model's dummy batch) beside the cached outputs; ``lm_bytes`` without one."""
    if p is None:
        return lm_bytes
    return max(encoder_peak_bytes(model, p, tp), lm_bytes + encoder_cache_bytes(model, p))
