"""The hand-kept tables :mod:`gen_profiles` reads beside the reference CSVs: the slugs of
the reference rows, per-model facts ``models.csv`` has no column for (tied embeddings,
recurrent state, vision encoders, MLA latents) and the host links of
``hardware-and-models.md`` §3.  Data only; each entry says where its numbers come from.
"""

from __future__ import annotations

GPU_SLUGS = {
    "GeForce RTX 3060 12GB": "rtx-3060-12gb",
    "GeForce RTX 3080 10GB": "rtx-3080-10gb",
    "GeForce RTX 3080 12GB": "rtx-3080-12gb",
    "GeForce RTX 3090": "rtx-3090",
    "GeForce RTX 3090 Ti": "rtx-3090-ti",
    "GeForce RTX 4060 Ti 16GB": "rtx-4060-ti-16gb",
    "GeForce RTX 4070": "rtx-4070",
    "GeForce RTX 4070 Ti SUPER": "rtx-4070-ti-super",
    "GeForce RTX 4080 SUPER": "rtx-4080-super",
    "GeForce RTX 4090": "rtx-4090",
    "GeForce RTX 5060 Ti 16GB": "rtx-5060-ti-16gb",
    "GeForce RTX 5070 Ti": "rtx-5070-ti",
    "GeForce RTX 5080": "rtx-5080",
    "GeForce RTX 5090": "rtx-5090",
    "RTX A4000": "rtx-a4000",
    "RTX A6000": "rtx-a6000",
    "RTX 6000 Ada Generation": "rtx-6000-ada",
    "RTX PRO 6000 Blackwell Workstation Edition": "rtx-pro-6000-blackwell",
    "TITAN RTX": "titan-rtx",
    "Radeon RX 7900 XTX": "rx-7900-xtx",
    "Radeon RX 7900 XT": "rx-7900-xt",
    "Radeon RX 9070 XT": "rx-9070-xt",
    "Radeon PRO W7900": "radeon-pro-w7900",
    "Arc B580": "arc-b580",
    "Arc A770 16GB": "arc-a770-16gb",
    "Apple M2 Ultra (76-core GPU)": "apple-m2-ultra",
    "Apple M3 Max (16-core CPU / 40-core GPU)": "apple-m3-max",
    "Apple M4 Max (16-core CPU / 40-core GPU)": "apple-m4-max",
    "NVIDIA DGX Spark (GB10)": "dgx-spark",
    "NVIDIA Jetson AGX Orin 64GB": "jetson-agx-orin-64gb",
    "AMD Ryzen AI Max+ 395 (Strix Halo, Radeon 8060S)": "strix-halo",
    "A100 40GB SXM4": "a100-40gb-sxm4",
    "A100 80GB SXM4": "a100-80gb-sxm4",
    "L4": "l4",
    "L40S": "l40s",
    "H100 SXM5 80GB": "h100-sxm5-80gb",
    "H100 PCIe 80GB": "h100-pcie-80gb",
    "H200 SXM 141GB": "h200-sxm-141gb",
    "B200 (HGX B200, 1000 W)": "b200",
}

TIED_EMBEDDINGS = frozenset({  # HF config tie_word_embeddings (Gemma's and mamba_ssm's
    "gemma-2-9b", "gemma-2-27b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b",  # configs
    "llama-3.2-1b", "llama-3.2-3b", "qwen3-4b", "mamba-2-2.7b"})  # default it to true)
"""Models whose output head is the token embedding (models.csv has no such column)."""
_LLM_PROF = "citsjtu2020/LLM-Prof sglang/Model_Config.md @8434c8d (verbatim config.json)"
FFN_WIDTHS = {  # slug: (intermediate_size, moe_intermediate_size, source)
    "llama-3.1-8b": (14336, None, _LLM_PROF), "llama-3.2-3b": (8192, None, _LLM_PROF),
    "qwen2.5-7b": (18944, None, _LLM_PROF), "qwen2.5-14b": (13824, None, _LLM_PROF),
    "qwen2.5-32b": (27648, None, _LLM_PROF), "qwen3-4b": (9728, None, _LLM_PROF),
    "qwen3-8b": (12288, None, _LLM_PROF), "qwen3-14b": (17408, None, _LLM_PROF),
    "qwen3-32b": (25600, None, _LLM_PROF), "qwen3-30b-a3b": (6144, 768, _LLM_PROF),
    "qwen2.5-72b": (29568, None, "models.csv source (the config copy's intermediate_size)"),
    "deepseek-v2-lite": (10944, 1408, ("a full DeepseekV2Config print of deepseek-ai/"
                                       "DeepSeek-V2-Lite (public code index file id "
                                       "62526029280)")),
    "gpt-oss-20b": (2880, 2880, ("AI-Hypercomputer/maxtext configs/models/gpt-oss-20b.yml "
                                 "(base_mlp_dim, base_moe_mlp_dim)")),
    "gpt-oss-120b": (2880, 2880, ("AI-Hypercomputer/maxtext configs/models/gpt-oss-20b.yml "
                                  "(the 120b shares the widths)")),
}
"""FFN widths of models.csv models (it has no such column): the down projections' rows,
which set a GGUF k-quant's fallback (kvsim.model.gguf_mix). A model not here has none
recorded, and kvsim takes its widths as multiples of 256."""
RELEASED_EXPERT_FORMAT = {"gpt-oss-20b": "mxfp4", "gpt-oss-120b": "mxfp4"}
"""Routed experts released quantised (models.csv gpt-oss notes: MXFP4 experts)."""
MODEL_SLUGS = {
    "Llama-3.1-8B": "llama-3.1-8b", "Llama-3.1-70B": "llama-3.1-70b",
    "Llama-3.2-1B": "llama-3.2-1b", "Llama-3.2-3B": "llama-3.2-3b",
    "Qwen2.5-7B": "qwen2.5-7b", "Qwen2.5-14B": "qwen2.5-14b", "Qwen2.5-32B": "qwen2.5-32b",
    "Qwen2.5-72B": "qwen2.5-72b", "Qwen3-4B": "qwen3-4b", "Qwen3-8B": "qwen3-8b",
    "Qwen3-14B": "qwen3-14b", "Qwen3-32B": "qwen3-32b", "Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Mistral-7B-v0.3": "mistral-7b-v0.3", "Mistral-Nemo-12B-2407": "mistral-nemo-12b",
    "Mistral-Small-24B-2501": "mistral-small-24b", "Gemma-2-9B": "gemma-2-9b",
    "Gemma-2-27B": "gemma-2-27b", "Gemma-3-4B": "gemma-3-4b", "Gemma-3-12B": "gemma-3-12b",
    "Gemma-3-27B": "gemma-3-27b", "Phi-3.5-mini": "phi-3.5-mini", "Phi-4-14B": "phi-4-14b",
    "DeepSeek-V2-Lite": "deepseek-v2-lite", "DeepSeek-V3": "deepseek-v3",
    "gpt-oss-20b": "gpt-oss-20b", "gpt-oss-120b": "gpt-oss-120b",
    "Qwen3-Next-80B-A3B": "qwen3-next-80b-a3b", "Llama-4-Scout-17B-16E": "llama-4-scout-17b-16e",
    "Jamba-v0.1 (52B; same geometry as Jamba-1.5-Mini)": "jamba-v0.1",
    "Mamba-2-2.7B (pure SSM reference)": "mamba-2-2.7b",
}

# Recurrent state elements per layer: (SSM state, convolution window), from the kv_formula
# column of models.csv with the window at d_conv - 1 columns, as llama.cpp allocates it
# (llama_hparams::n_embd_r: "(ssm_d_conv - 1) * (ssm_d_inner + 2*ssm_n_group*ssm_d_state)";
# the first column is shifted out, so it is not kept) and vLLM's conv state
# (conv_kernel - 1 rows).  models.csv writes the Mamba windows with d_conv columns.
RECURRENT_STATE = {
    # Gated DeltaNet: v_heads*k_dim*v_dim + (kernel-1)*(2*k_heads*k_dim + v_heads*v_dim)
    "Qwen3-Next-80B-A3B": (32 * 128 * 128, 3 * (2 * 16 * 128 + 32 * 128)),
    # Mamba-1: d_inner*d_state + (d_conv-1)*d_inner, d_inner = 2*4096
    "Jamba-v0.1 (52B; same geometry as Jamba-1.5-Mini)": (8192 * 16, 3 * 8192),
    # Mamba-2: nheads*headdim*d_state + (d_conv-1)*(d_inner + 2*ngroups*d_state)
    "Mamba-2-2.7B (pure SSM reference)": (80 * 64 * 128, 3 * (5120 + 2 * 1 * 128)),
}
GEMMA3_SIGLIP = {  # google/gemma-3-4b-it config.json vision_config (quoted whole in a public
    # parser test, code-index file id 54945561017); the Gemma 3 report (table 1) gives the
    # 4B, 12B and 27B one 417M SigLIP encoder; 896 px / 14 px patches = 4,096 positions,
    # pooled to the config's mm_tokens_per_image 256 tokens an image
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14,
    "position_embeddings": (896 // 14) ** 2, "post_norm": True, "max_image_tokens": 256,
    "attention_heads": 16}
VISION_ENCODERS = {slug: {**GEMMA3_SIGLIP, "out_hidden_size": hidden} for slug, hidden in
                   (("gemma-3-4b", 2560), ("gemma-3-12b", 3840), ("gemma-3-27b", 5376))}
"""Vision-language checkpoints' image encoders (models.csv has no such columns)."""
MLA_LATENT = {"DeepSeek-V2-Lite": 512 + 64, "DeepSeek-V3": 512 + 64}  # kv_lora_rank + qk_rope
# Mamba-2 has no positional limit; models.csv says "n/a (recurrent)".
NO_POSITION_LIMIT_TOKENS = 1048576

# hardware-and-models.md §3: measured effective pinned bandwidth, midpoints of ranges.
LINKS = [
    ("pcie3-x8", "PCIe 3.0 x8", 6.25e9, 7.88e9,
     "ESTIMATE: half of the Gen3 x16 planning value (12-13 GB/s); no measurement in reference",
     "hardware-and-models.md §3 (Gen3 x16 row, scaled by lanes)"),
    ("pcie3-x16", "PCIe 3.0 x16", 12.5e9, 15.75e9,
     "midpoint of 12-13 GB/s (P100 bandwidthTest 12.15 H2D / 12.89 D2H; 2080 Ti 13.1 H2D)",
     "hardware-and-models.md §3; mpicbg-scicomp/gearshifft PR #82; usadellab/Helixer #22"),
    ("pcie4-x8", "PCIe 4.0 x8", 12.5e9, 15.75e9,
     "ESTIMATE: midpoint of 12-13 GB/s, same link budget as Gen3 x16 (4060 Ti, 5060 Ti, B580)",
     "hardware-and-models.md §3; hardwareluxx RTX 4060 Ti review (x8, 15.754 GB/s theor.)"),
    ("pcie4-x16", "PCIe 4.0 x16", 25.0e9, 31.5e9,
     "midpoint of 24-26 GB/s (A100 measured peak 25 GB/s; 3x4090 staged 25.6-26.2 GB/s)",
     "hardware-and-models.md §3; ZaidQureshi/bam #54; tinygrad/open-gpu-kernel-modules #6"),
    ("pcie5-x8", "PCIe 5.0 x8", 26.5e9, 31.5e9,
     "ESTIMATE: midpoint of 25-28 GB/s, by analogy with Gen4 x16",
     "hardware-and-models.md §3"),
    ("pcie5-x16", "PCIe 5.0 x16", 55.0e9, 63.0e9,
     "midpoint of 53-57 GB/s (RTX 5090 nvbandwidth 56.3 H2D / 57.3 D2H; ~50.9 each way duplex)",
     "hardware-and-models.md §3; tinygrad/open-gpu-kernel-modules #29"),
]
