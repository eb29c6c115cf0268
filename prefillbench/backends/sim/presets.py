"""The models and GPUs the sim knows by name, each with the sources of its figures (listed in docs/sim.md too).

A name is looked up here by configs.load_model_spec and load_gpu_spec; the types are specs'.
"""
from __future__ import annotations

from prefillbench.backends.sim.specs import WEIGHT_FORMATS, GiB, GPUSpec, ModelSpec


def _alternating(window: int, n: int, first_sliding: bool = True) -> tuple[int, ...]:
    return tuple(window if (i % 2 == 0) == first_sliding else 0 for i in range(n))


MIXTRAL_SOURCE = ("Mixtral paper (arXiv 2401.04088); https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json "
                  "(num_local_experts 8, num_experts_per_tok 2, sliding_window null)")
DEEPSEEK_V3_MTP = ("DeepSeek-V3's multi-token-prediction layer (num_nextn_predict_layers 1) is not priced: it is served "
                   "only for speculative decoding, which the sim does not model (vLLM and SGLang skip it by default)")
GPT_OSS_SOURCE = ("https://huggingface.co/openai/gpt-oss-{size}/blob/main/config.json; gpt-oss model card (arXiv 2508.10925): "
                  "experts in MXFP4 (quantization_config mxfp4, attention, router, embedding and head bf16), alternating "
                  "128-token sliding-window and full attention (layer_types); attention sinks and biases not priced")

# Shapes from the papers and the published config.json files named in `source`.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-13b", 40, 5120, 40, 40, 13824, 32000, max_context=2048,
                  source="LLaMA paper (arXiv 2302.13971) Table 2; huggyllama/llama-13b config.json"),
        ModelSpec("llama-33b", 60, 6656, 52, 52, 17920, 32000, max_context=2048,
                  source="LLaMA paper (arXiv 2302.13971) Table 2; huggyllama/llama-30b config.json"),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, max_context=4096,
                  source="Llama 2 paper (arXiv 2307.09288); meta-llama/Llama-2-70b-hf config.json"),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, max_context=32768, windows=(4096,) * 32,
                  source="Mistral 7B paper (arXiv 2310.06825) Table 1; mistralai/Mistral-7B-v0.1 config.json "
                  "(sliding_window 4096 on every layer)"),
        ModelSpec("yi-34b", 60, 7168, 56, 8, 20480, 64000, max_context=200000,
                  source="https://huggingface.co/01-ai/Yi-34B/blob/main/config.json (num_hidden_layers 60, hidden_size "
                  "7168, num_attention_heads 56, num_key_value_heads 8, intermediate_size 20480, vocab_size 64000); "
                  "Yi-34B-200K, which Sarathi-Serve's artifact runs, has the same shapes (max_context its 200K)"),
        ModelSpec("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 50257, gated_mlp=False, tied_embeddings=True,
                  max_context=2048, source="GPT-3 paper (arXiv 2005.14165) Table 2.1"),
        # ---- models deployed today
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, max_context=131072,
                  source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, max_context=131072,
                  source="https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"),
        ModelSpec("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, head_dim=128, max_context=40960,
                  source="https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (head_dim 128, q/k norms not priced)"),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_dim=128, max_context=40960,
                  n_experts=128, experts_per_tok=8, moe_ffn=768,
                  source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (num_experts 128, "
                  "num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1, no shared expert)"),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, max_context=32768, n_experts=8, experts_per_tok=2,
                  source=MIXTRAL_SOURCE),
        ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, max_context=163840,
                  n_experts=256, experts_per_tok=8, moe_ffn=2048, shared_ffn=2048, dense_layers=(0, 1, 2),
                  kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                  weight_bytes=1.0, head_weight_bytes=2.0, fp8_compute=True,
                  precision="weights fp8 as released (W8A8; embedding, LM head and router bf16); KV cache bf16",
                  approximations=(DEEPSEEK_V3_MTP,),
                  source="DeepSeek-V3 report (arXiv 2412.19437); https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/"
                  "config.json (n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8, moe_intermediate_size "
                  "2048, first_k_dense_replace 3, kv_lora_rank 512, q_lora_rank 1536, qk_rope_head_dim 64, "
                  "qk_nope_head_dim 128, v_head_dim 128, quantization_config fp8 e4m3 128x128 blocks; group-limited "
                  "routing priced as uniform)"),
        ModelSpec("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, head_dim=64, max_context=131072,
                  n_experts=32, experts_per_tok=4, windows=_alternating(128, 24),
                  weight_bytes=2.0, expert_weight_bytes=WEIGHT_FORMATS["mxfp4"], head_weight_bytes=2.0,
                  precision="experts mxfp4 as released (4.25 bits), other weights bf16; KV cache bf16",
                  source=GPT_OSS_SOURCE.format(size="20b")),
        ModelSpec("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, head_dim=64, max_context=131072,
                  n_experts=128, experts_per_tok=4, windows=_alternating(128, 36),
                  weight_bytes=2.0, expert_weight_bytes=WEIGHT_FORMATS["mxfp4"], head_weight_bytes=2.0,
                  precision="experts mxfp4 as released (4.25 bits), other weights bf16; KV cache bf16",
                  source=GPT_OSS_SOURCE.format(size="120b")),
    )
}
MODEL_ALIASES = {"llama-30b": "llama-33b", "llama2-70b": "llama-2-70b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b",
                 "llama-3.1-8b-instruct": "llama-3.1-8b", "llama-3-8b": "llama-3.1-8b", "llama-3.1-70b-instruct": "llama-3.1-70b",
                 "mixtral-8x7b-instruct": "mixtral-8x7b", "mixtral": "mixtral-8x7b",
                 "qwen3-30b": "qwen3-30b-a3b"}


GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("A6000", 154.8e12, 768e9, 48 * GiB, 32e9, link="pcie4", pcie_gen=4, bridge_bw=56.25e9,
                source="NVIDIA RTX A6000 datasheet: 154.8 TFLOPS tensor (FP16, dense), 768 GB/s GDDR6, 48 GB; PCIe 4.0 x16; "
                "NVLink bridge for 2 cards, 112.5 GB/s bidirectional (56.25 per direction)"),
        GPUSpec("A100-SXM", 312e12, 2039e9, 80 * GiB, 300e9, network_bw=25e9, link="nvlink3", pcie_gen=4,
                source="NVIDIA A100 datasheet (80GB SXM): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, 600 GB/s NVLink "
                "(300 per direction); 200 Gb/s HDR InfiniBand per GPU (DGX A100)"),
        GPUSpec("A100-PCIe", 312e12, 1935e9, 80 * GiB, 32e9, network_bw=25e9, link="pcie4", pcie_gen=4,
                bridge_bw=300e9,
                source="NVIDIA A100 datasheet (80GB PCIe): 312 TFLOPS BF16 dense, 1,935 GB/s HBM2e; PCIe 4.0 x16 (64 "
                "GB/s both ways); NVLink Bridge for 2 GPUs, 600 GB/s (300 per direction)"),
        GPUSpec("H100-SXM", 989e12, 3.35e12, 80 * GiB, 450e9, network_bw=50e9, fp8_flops=1979e12, link="nvlink4",
                pcie_gen=5,
                source="NVIDIA H100 datasheet (SXM): 989 TFLOPS BF16 dense (1,979 with sparsity), 1,979 FP8 dense "
                "(3,958 with sparsity), 80 GB HBM3 at 3.35 TB/s, 900 GB/s NVLink (450 per direction); 400 Gb/s NDR "
                "InfiniBand per GPU (DGX H100); https://www.nvidia.com/en-us/data-center/h100/"),
        # NVIDIA's "141 GB" and "180 GB" are GiB, as its "80 GB" are: nvidia-smi reports 143,771 MiB (140.4 GiB) on
        # an H200 (NVIDIA/TensorRT-LLM#9554) and 183,359 MiB (179.1 GiB) on a B200 (NVIDIA/TensorRT-LLM#10278); 141e9
        # and 180e9 bytes would be 131.3 and 167.6 GiB, 7% less than the devices hold.
        GPUSpec("H200", 989e12, 4.8e12, 141 * GiB, 450e9, network_bw=50e9, fp8_flops=1979e12, link="nvlink4",
                pcie_gen=5,
                source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 1,979 FP8 dense (3,958 with sparsity), "
                "4.8 TB/s HBM3e, 141 GB, 900 GB/s NVLink; https://www.nvidia.com/en-us/data-center/h200/; the 141 GB "
                "are GiB: nvidia-smi reports 143,771 MiB total (140.4 GiB), NVIDIA/TensorRT-LLM issue #9554"),
        GPUSpec("B200", 2.25e15, 8e12, 180 * GiB, 900e9, network_bw=50e9, fp8_flops=4.5e15, link="nvlink5",
                pcie_gen=5,
                source="NVIDIA DGX B200 / HGX B200 datasheets, per GPU (the 8-GPU figures / 8): 2.25 PFLOPS BF16 dense "
                "(36 PF sparse / 8 / 2), 4.5 PFLOPS FP8 dense (72 PF sparse / 8 / 2), 180 GB HBM3e (1,440 GB / 8), "
                "8 TB/s (64 TB/s / 8), NVLink 5 1.8 TB/s (900 GB/s per direction), 400 Gb/s ConnectX-7 per GPU; "
                "https://www.nvidia.com/en-us/data-center/dgx-b200/ (FP4 tensor cores not priced); the 180 GB are GiB: "
                "nvidia-smi reports 183,359 MiB total (179.1 GiB), NVIDIA/TensorRT-LLM issue #10278"),
        GPUSpec("MI300X", 1307.4e12, 5.3e12, 192 * GiB, 448e9, network_bw=50e9, fp8_flops=2614.9e12,
                link="infinity-fabric", pcie_gen=5,
                source="AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16 dense (2,614.9 with sparsity), 2,614.9 "
                "FP8 dense, 192 GB HBM3, 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s (896 GB/s aggregate, 448 per "
                "direction) in an 8-GPU platform, 400 Gb/s per GPU; https://www.amd.com/content/dam/amd/en/documents/"
                "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf; the 192 GB are GiB: AMD's "
                "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html lists VRAM 192 GiB (the generic "
                "attained fractions are NVIDIA's; measured MI300X GEMMs reach less of their peak)"),
        GPUSpec("L40S", 362.05e12, 864e9, 48 * GiB, 32e9, fp8_flops=733e12, link="pcie4", pcie_gen=4,
                source="NVIDIA L40S datasheet: 362.05 TFLOPS BF16 tensor dense (733 with sparsity), 733 FP8 dense "
                "(1,466 with sparsity), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16 (no NVLink); "
                "https://www.nvidia.com/en-us/data-center/l40s/"),
        # ---- PCIe cards, each in its PCIe slot by default (--sim-link: links.py)
        GPUSpec("H100-PCIe", 756e12, 2.0e12, 80 * GiB, 64e9, network_bw=50e9, fp8_flops=1513e12, link="pcie5",
                pcie_gen=5, bridge_bw=300e9,
                source="NVIDIA H100 Tensor Core GPU datasheet (2022), H100 PCIe: 1,513 TFLOPS BF16 with sparsity (756 "
                "dense), 3,026 FP8 with sparsity (1,513 dense), 80 GB HBM2e at 2 TB/s, NVLink bridge 600 GB/s (300 per "
                "direction), PCIe 5.0 x16 128 GB/s (64 per direction); AIConfigurator 0.12.0 systems/h100_pcie.yaml "
                "gives the same (756.5 TFLOPS dense, 2 TB/s, 80 GiB)"),
        # NVIDIA's "94 GB" taken as GiB, as its "80 GB" and "141 GB" are (above).
        GPUSpec("H100-NVL", 835.5e12, 3.9e12, 94 * GiB, 64e9, network_bw=50e9, fp8_flops=1670.5e12, link="pcie5",
                pcie_gen=5, bridge_bw=300e9,
                source="NVIDIA H100 datasheet, H100 NVL: 1,671 TFLOPS BF16 with sparsity (835.5 dense), 3,341 FP8 with "
                "sparsity (1,670.5 dense), 94 GB HBM3 at 3.9 TB/s, NVLink bridge 600 GB/s (300 per direction) for a "
                "pair, PCIe 5.0 x16 128 GB/s (64 per direction); https://www.nvidia.com/en-us/data-center/h100/"),
        GPUSpec("L4", 121e12, 300e9, 24 * GiB, 32e9, fp8_flops=242.5e12, link="pcie4", pcie_gen=4,
                source="NVIDIA L4 datasheet: 242 TFLOPS BF16 tensor with sparsity (121 dense), 485 FP8 with sparsity "
                "(242.5 dense), 24 GB GDDR6 at 300 GB/s, PCIe 4.0 x16 64 GB/s (32 per direction), no NVLink; "
                "https://www.nvidia.com/en-us/data-center/l4/ (AIConfigurator 0.12.0 systems/l4.yaml: the same)"),
        GPUSpec("RTX6000-Ada", 364.2e12, 960e9, 48 * GiB, 32e9, fp8_flops=728.4e12, link="pcie4", pcie_gen=4,
                source="NVIDIA RTX 6000 Ada datasheet: 48 GB GDDR6 at 960 GB/s, PCIe 4.0 x16, no NVLink, 1,457 TFLOPS "
                "FP8 tensor with sparsity; NVIDIA Ada Lovelace architecture whitepaper (RTX 6000 Ada column): 364.2 "
                "TFLOPS FP16/BF16 tensor with FP32 accumulate dense (728.4 with sparsity), 728.4 FP8 dense"),
        # For calibrating against a CPU backend: nominal figures, the fit supplies what is attained.
        GPUSpec("CPU", 1e12, 50e9, 16 * GiB, 10e9, compute_fraction=0.1, memory_fraction=0.5, memory_reserve_bytes=0,
                source="nominal placeholder for calibration on a CPU; meaningless uncalibrated"),
    )
}
GPU_ALIASES = {"a100": "A100-SXM", "a100-80gb": "A100-SXM", "h100": "H100-SXM", "h200-sxm": "H200", "b200-sxm": "B200",
               "mi300": "MI300X", "rtx-6000-ada": "RTX6000-Ada", "rtx6000ada": "RTX6000-Ada", "h100nvl": "H100-NVL"}


__all__ = ["GPU_ALIASES", "GPU_PRESETS", "MODEL_ALIASES", "MODEL_PRESETS"]
