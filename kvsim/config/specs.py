"""Hardware and model profiles as frozen value types.

These are the boundary types between the catalogue (YAML files under
``hardware_profiles/``) and everything that computes: KV geometry, the roofline
latency model, the simulator, fit and plan.  They are data, not behaviour: no
class hierarchies, one model per kind of profile, SI units in every name.

NOTE: every profile carries ``source`` and ``notes`` so each number can be traced
back to ``docs/reference``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from kvsim.config.units import Bytes, BytesPerS, FrozenModel, Seconds
from kvsim.errors import InputError

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GpuSpec(FrozenModel):
    """One accelerator (discrete card or unified-memory SoC)."""

    model_config = _FROZEN

    name: str = Field(description="slug, e.g. 'rtx-4090'")
    display_name: str
    vendor: str
    segment: str
    memory_bytes: Bytes = Field(gt=0, description="marketed capacity (binary GiB for GDDR/HBM)")
    memory_type: str = ""
    memory_bandwidth_bytes_per_s: BytesPerS = Field(gt=0, description="theoretical peak")
    fp16_tensor_flops: float = Field(gt=0, description="dense FP16 tensor FLOP/s (FP16 accumulate)")
    fp16_fp32acc_tensor_flops: float = Field(gt=0, description="dense FP16/BF16, FP32 accumulate")
    fp8_tensor_flops: float | None = None
    int8_tensor_ops: float | None = None
    pcie_gen: int | None = Field(None, gt=0)
    pcie_lanes: int | None = Field(None, gt=0)
    unified_memory: bool = False
    gpu_memory_limit_bytes: Bytes | None = Field(
        None, gt=0, description="unified memory: what the GPU may use by default "
        "(docs/reference/hardware-and-models.md §4); None = all of memory_bytes")
    default_link: str | None = Field(None, description="link profile slug; None for unified memory")
    tdp_w: str = ""
    launch_price_usd: float | None = None
    launch_year: int | None = None
    l2_cache_bytes: Bytes | None = None
    # What the speed model (kvsim.latency.backend) needs beyond peak rates: the
    # architecture class selects its fitted constants; the vector FP32 rate prices
    # kernels that run on shader cores (Apple, pre-tensor-core cards, dp4a paths).
    architecture: str = Field("", description="architecture family, e.g. 'ada', 'ampere', "
                              "'rdna3', 'cdna2', 'apple-m3', 'xe-hpg' (kvsim.latency.backend)")
    fp32_flops: float | None = Field(None, gt=0, description="dense vector FP32 FLOP/s at "
                                     "boost clock (no tensor cores)")
    compute_units: int | None = Field(None, gt=0, description="SMs / CUs / Xe cores / Apple "
                                      "GPU cores")
    boost_clock_hz: float | None = Field(None, gt=0)
    aliases: tuple[str, ...] = Field((), description="names engines and tools print for this "
                                     "device (nvidia-smi, llama-bench gpu_info, Metal)")
    nvlink: bool = Field(False, description="the card has an NVLink connector (bridge or "
                         "SXM): an nvlink GPU link is possible between two such cards")
    cuda_total_bytes: Bytes | None = Field(
        None, gt=0, description="the total the driver reports (cudaMemGetInfo, as vLLM's "
        "total_gpu_memory and llama.cpp's memory breakdown print it), where a start-up log "
        "shows it; None = kvsim.config.device_memory's rule")
    cuda_total_source: str = ""
    # Planning efficiencies for the roofline model (sustained / peak).  Documented in
    # docs/reference/hardware-and-models.md §1: sustained bandwidth is typically 80-92 % of peak.
    bandwidth_efficiency: float = Field(0.85, gt=0, le=1)
    compute_efficiency: float = Field(0.5, gt=0, le=1)
    source: str
    notes: str = ""

    @model_validator(mode="after")
    def _limit_within_memory(self) -> GpuSpec:
        if self.gpu_memory_limit_bytes is not None and \
                self.gpu_memory_limit_bytes > self.memory_bytes:
            raise InputError("gpu_memory_limit_bytes", self.gpu_memory_limit_bytes,
                             f"at most memory_bytes ({self.memory_bytes}): the GPU cannot use "
                             "more than the machine has")
        return self

    @property
    def usable_memory_bytes(self) -> int:
        """The memory an engine may allocate on this device: the total the driver reports
        on a discrete card (below the marketed size: :attr:`reported_memory_bytes`), the
        default GPU limit on a unified-memory machine."""
        if self.unified_memory or self.gpu_memory_limit_bytes:
            return self.gpu_memory_limit_bytes or self.memory_bytes
        return self.reported_memory_bytes

    @property
    def reported_memory_bytes(self) -> int:
        """The memory the driver reports as the device's total (vLLM / SGLang size their
        share of it): the measured ``cuda_total_bytes`` or the documented rule
        (:func:`kvsim.config.device_memory.reported_total_bytes`)."""
        from kvsim.config.device_memory import reported_total_bytes
        return reported_total_bytes(self)


class LinkSpec(FrozenModel):
    """Host↔device link (PCIe) with measured effective per-direction bandwidth."""

    model_config = _FROZEN

    name: str
    display_name: str
    h2d_bytes_per_s: BytesPerS = Field(gt=0, description="pinned host→device, large copies")
    d2h_bytes_per_s: BytesPerS = Field(gt=0, description="pinned device→host, large copies")
    latency_s: Seconds = Field(ge=0, description="per-transfer fixed latency")
    duplex_factor: float = Field(0.9, gt=0, le=1, description="per-direction rate when both run")
    pageable_factor: float = Field(0.55, gt=0, le=1, description="pageable / pinned rate")
    theoretical_bytes_per_s: BytesPerS | None = None
    source: str
    notes: str = ""


class GpuLinkSpec(FrozenModel):
    """The link between the GPUs of one box (PCIe with or without P2P, NVLink).

    NOTE: ``bytes_per_s`` is the rate each direction keeps while both directions run, as
    a ring all-reduce or a pipeline of activations uses the link; ``latency_s`` is paid
    per transfer (one hop of a ring step).
    """

    model_config = _FROZEN

    name: str
    display_name: str
    kind: Literal["pcie", "nvlink"]
    p2p: bool = Field(description="direct GPU-to-GPU copies; false = staged through host RAM")
    pcie_gen: int | None = Field(None, gt=0, description="PCIe links: the generation needed")
    pcie_lanes: int | None = Field(None, gt=0, description="PCIe links: lanes per card")
    bytes_per_s: BytesPerS = Field(gt=0, description="per direction, both directions busy")
    latency_s: Seconds = Field(ge=0, description="per transfer")
    source: str
    notes: str = ""


class HostSpec(FrozenModel):
    """Host memory available to the engine for offload and prompt caches."""

    model_config = _FROZEN

    name: str
    display_name: str
    memory_bytes: Bytes = Field(gt=0)
    memory_bandwidth_bytes_per_s: BytesPerS = Field(gt=0)
    cpu_flops: float = Field(gt=0, description="sustained CPU FLOP/s for layers offloaded to CPU")
    unified_with_gpu: bool = False
    source: str
    notes: str = ""


LayerKind = Literal["full", "sliding", "chunked", "mla", "recurrent", "ffn"]
ATTENTION_KINDS = frozenset({"full", "sliding", "chunked", "mla"})
"""Layer kinds that hold a KV cache growing with the tokens (a ``recurrent`` layer holds a
fixed state, an ``ffn`` layer nothing)."""


class LayerGroup(FrozenModel):
    """A set of layers that share one KV layout.

    - ``full``: K and V per token per layer: ``n_kv_heads * (head_dim_k + head_dim_v)``.
    - ``sliding``: as full, but only the most recent ``window_tokens`` are needed.
    - ``chunked``: as full, but attention stays within fixed ``window_tokens`` chunks.
    - ``mla``: one latent of ``latent_dim`` values per token per layer (K and V share it).
    - ``recurrent``: a fixed state of ``state_elements`` values per sequence per layer, of
      which ``conv_state_elements`` are the convolution window (an engine may keep the two
      parts in different dtypes: vLLM holds the window in the model's 16-bit dtype).
    - ``ffn``: an MLP / MoE-only layer (Nemotron-H's ``E`` and ``-`` blocks): a layer of
      weights that holds no cache at all.
    """

    model_config = _FROZEN

    kind: LayerKind
    layers: int = Field(gt=0, description="number of layers in this group")
    layer_indices: tuple[int, ...] | None = None
    n_kv_heads: int = Field(0, ge=0)
    head_dim_k: int = Field(0, ge=0)
    head_dim_v: int = Field(0, ge=0)
    window_tokens: int | None = Field(None, gt=0)
    latent_dim: int = Field(0, ge=0)
    state_elements: int = Field(0, ge=0, description="recurrent state elements per layer")
    conv_state_elements: int = Field(0, ge=0, description="of state_elements, the "
                                     "convolution window's (0: not told apart)")

    @model_validator(mode="after")
    def _check(self) -> LayerGroup:
        if self.kind in ("full", "sliding", "chunked") and not (
                self.n_kv_heads and self.head_dim_k and self.head_dim_v):
            raise InputError("n_kv_heads", self.n_kv_heads, f"{self.kind} layers need "
                             "n_kv_heads, head_dim_k and head_dim_v all > 0")
        if self.kind in ("sliding", "chunked") and not self.window_tokens:
            raise InputError("window_tokens", None, f"{self.kind} layers need window_tokens")
        if self.kind == "mla" and not self.latent_dim:
            raise InputError("latent_dim", 0, "mla layers need latent_dim > 0 (kv_lora_rank + "
                             "qk_rope_head_dim)")
        if self.kind == "recurrent" and not self.state_elements:
            raise InputError("state_elements", 0, "recurrent layers need state_elements > 0")
        if self.conv_state_elements > self.state_elements:
            raise InputError("conv_state_elements", self.conv_state_elements,
                             f"at most state_elements ({self.state_elements}): the convolution "
                             "window is part of the recurrent state")
        if self.layer_indices is not None and len(self.layer_indices) != self.layers:
            raise InputError("layer_indices", f"{len(self.layer_indices)} indices",
                             f"must list exactly `layers` ({self.layers}) indices")
        return self


class VisionEncoder(FrozenModel):
    """The image encoder (a ViT) and projector of a vision-language checkpoint, from its
    published ``vision_config``: what it weighs (:func:`kvsim.model.vision.vision_params`).

    Each block is a LayerNorm (or RMSNorm) pair, Q/K/V and output projections with
    biases and an MLP with biases (gated SwiGLU when ``gated_mlp``).  The projector is,
    with ``spatial_merge_size`` > 1 (Qwen-VL), a norm and a two-layer MLP over each
    ``merge x merge`` patch group; else (Gemma 3's SigLIP) an RMSNorm and one linear map.
    An image is ``max_image_tokens x merge²`` patches with a merger, else
    ``position_embeddings`` patches (one fixed-size image).
    """

    model_config = _FROZEN

    depth: int = Field(gt=0, description="encoder blocks")
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    patch_size: int = Field(gt=0)
    temporal_patch_size: int = Field(1, gt=0, description="frames one patch spans (Qwen-VL 2)")
    in_channels: int = Field(3, gt=0)
    position_embeddings: int = Field(0, ge=0, description="learned absolute positions "
                                     "(0: rotary positions only)")
    gated_mlp: bool = False
    norm_bias: bool = Field(True, description="LayerNorm (weight and bias); False: RMSNorm")
    patch_bias: bool = True
    post_norm: bool = Field(False, description="a final norm after the blocks (SigLIP)")
    spatial_merge_size: int = Field(1, gt=0)
    out_hidden_size: int = Field(gt=0, description="the language model's hidden size")
    max_image_tokens: int = Field(0, ge=0, description="the image processor's largest image "
                                  "in language-model tokens (0: not known; vLLM's profiling "
                                  "pass over the encoder is then not sized)")
    video_largest: bool = Field(False, description="vLLM's largest item for this family is "
                                "a video that grows with max_model_len (Qwen2-VL processing): "
                                "its profiling pass is then not sized")
    attention_heads: int | None = Field(None, gt=0, description="the encoder's attention "
                                        "heads (Ollama sizes its graph by them); None: not "
                                        "recorded")


class ModelSpec(FrozenModel):
    """A model's geometry: what its weights and its KV cache cost."""

    model_config = _FROZEN

    name: str = Field(description="slug, e.g. 'llama-3.1-8b'")
    display_name: str
    hf_repo: str = ""
    params_total: float = Field(gt=0, description="parameters resident in memory")
    params_active: float = Field(gt=0, description="parameters read per decoded token (MoE)")
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(ge=0)
    num_kv_heads: int = Field(ge=0)
    head_dim: int = Field(ge=0)
    vocab_size: int = Field(gt=0)
    max_context_tokens: int = Field(gt=0)
    layer_groups: tuple[LayerGroup, ...]
    num_experts: int | None = Field(None, gt=0, description="MoE: routed experts per layer")
    num_experts_active: int | None = Field(None, gt=0, description="MoE: routed experts "
                                           "each token uses")
    attention_kind: str = ""
    ffn_intermediate_size: int | None = Field(
        None, gt=0, description="the dense MLP's (or shared expert's) hidden width (HF "
        "intermediate_size): the rows of its down projection, which a GGUF k-quant stores "
        "in a wider type when not a multiple of 256; None: not recorded, taken as one")
    moe_intermediate_size: int | None = Field(
        None, gt=0, description="one routed expert's hidden width (HF "
        "moe_intermediate_size); None: not recorded, ffn_intermediate_size's rule")
    released_expert_format: Literal["mxfp4"] | None = Field(
        None, description="the routed experts' format in the released checkpoint, which "
        "GGUF files of it keep (gpt-oss: mxfp4); None: 16-bit")
    ssm_state_dtype: str | None = Field(
        None, description="the dtype the config asks recurrent (SSM / linear-attention) "
        "state to be kept in (HF mamba_ssm_dtype: f32, bf16, f16); None: the model's 16-bit "
        "dtype. llama.cpp keeps it in f32 whatever this says")
    tied_embeddings: bool | None = Field(
        None, description="the output head shares the token embedding's weights (HF config "
        "tie_word_embeddings); None: not stated, read from the notes ('tied embeddings')")
    vision_encoder: VisionEncoder | None = Field(
        None, description="a vision-language checkpoint's image encoder, which vLLM and SGLang "
        "load beside the language model (a GGUF keeps it in a separate mmproj file); None: "
        "a text-only checkpoint, or an encoder not sized (the notes say which)")
    source: str
    notes: str = ""

    @model_validator(mode="after")
    def _check_layers(self) -> ModelSpec:
        total = sum(g.layers for g in self.layer_groups)
        if total != self.num_layers:
            raise InputError("num_layers", self.num_layers,
                             f"must equal the {total} layers that layer_groups cover")
        if self.params_active > self.params_total:
            raise InputError("params_active", self.params_active,
                             f"at most params_total ({self.params_total:g}): a token cannot "
                             "read more parameters than the model has")
        if any(g.kind in ATTENTION_KINDS for g in self.layer_groups):
            for key in ("num_attention_heads", "num_kv_heads", "head_dim"):
                if getattr(self, key) <= 0:
                    raise InputError(key, getattr(self, key), "> 0: a model with attention "
                                     "layers has attention heads (0 only for recurrent-only "
                                     "models)")
        return self
