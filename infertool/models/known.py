"""Architecture facts of well-known open models, for planning a deployment whose weights are not on
this machine (GPU recipes planned on a laptop or in CI). Values are the models' published config.json."""

from __future__ import annotations

import re

from infertool.perf.roofline import Arch

KNOWN_ARCHS: dict[str, tuple[Arch, str]] = {
    "smollm2-135m": (Arch(30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True), "HuggingFaceTB/SmolLM2-135M-Instruct config.json"),
    "llama-3.1-8b": (Arch(32, 4096, 32, 8, 128, 14336, 128256), "meta-llama/Llama-3.1-8B-Instruct config.json"),
    "llama-3.3-70b": (Arch(80, 8192, 64, 8, 128, 28672, 128256), "meta-llama/Llama-3.3-70B-Instruct config.json"),
    "llama-3.1-70b": (Arch(80, 8192, 64, 8, 128, 28672, 128256), "meta-llama/Llama-3.1-70B-Instruct config.json"),
    "llama-2-70b": (Arch(80, 8192, 64, 8, 128, 28672, 32000), "meta-llama/Llama-2-70b-hf config.json"),
    "llama-2-7b": (Arch(32, 4096, 32, 32, 128, 11008, 32000), "meta-llama/Llama-2-7b-hf config.json"),
    "qwen2.5-7b": (Arch(28, 3584, 28, 4, 128, 18944, 152064), "Qwen/Qwen2.5-7B-Instruct config.json"),
    "mistral-7b": (Arch(32, 4096, 32, 8, 128, 14336, 32768), "mistralai/Mistral-7B-Instruct-v0.3 config.json"),
    "deepseek-r1-distill-llama-70b": (Arch(80, 8192, 64, 8, 128, 28672, 128256), "neuralmagic/DeepSeek-R1-Distill-Llama-70B-quantized.w4a16 config.json (the base model's shape)"),
    "deepseek-r1-distill-llama-8b": (Arch(32, 4096, 32, 8, 128, 14336, 128256), "deepseek-ai/DeepSeek-R1-Distill-Llama-8B config.json (as fine-tunes of it copy it)"),
    "deepseek-r1-distill-qwen-32b": (Arch(64, 5120, 40, 8, 128, 27648, 152064), "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B config.json (as fine-tunes of it copy it)"),
    "deepseek-r1-distill-qwen-14b": (Arch(48, 5120, 40, 8, 128, 13824, 152064), "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B config.json (as quantized copies of it copy it)"),
    "qwen3-8b": (Arch(36, 4096, 32, 8, 128, 12288, 151936), "Qwen/Qwen3-8B config.json (as copies of it show it)"),
    "qwen3-14b": (Arch(40, 5120, 40, 8, 128, 17408, 151936), "Qwen/Qwen3-14B config.json values (as quoted by model registries)"),
    "qwen3-32b": (Arch(64, 5120, 64, 8, 128, 25600, 151936), "Qwen/Qwen3-32B config.json values (as quoted by model registries)"),
    "qwen2.5-0.5b": (Arch(24, 896, 14, 2, 64, 4864, 151936, tie_word_embeddings=True), "Qwen/Qwen2.5-0.5B-Instruct config.json (as copies of it show it)"),
    "qwen3-0.6b": (Arch(28, 1024, 16, 8, 128, 3072, 151936, tie_word_embeddings=True), "Qwen/Qwen3-0.6B config.json shape (as fine-tunes of it copy it)"),
    "mixtral-8x7b": (Arch(32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_tok=2), "mistralai/Mixtral-8x7B-Instruct-v0.1 config.json"),
}

MAX_POSITIONS = {"smollm2-135m": 8192, "llama-3.1-8b": 131072, "llama-3.3-70b": 131072, "llama-3.1-70b": 131072,
                 "llama-2-70b": 4096, "llama-2-7b": 4096, "qwen2.5-7b": 32768, "mistral-7b": 32768, "mixtral-8x7b": 32768,
                 "deepseek-r1-distill-llama-70b": 131072, "deepseek-r1-distill-llama-8b": 131072,
                 "deepseek-r1-distill-qwen-32b": 131072, "deepseek-r1-distill-qwen-14b": 131072, "qwen3-8b": 40960,
                 "qwen3-14b": 40960, "qwen3-32b": 40960, "qwen2.5-0.5b": 32768, "qwen3-0.6b": 40960}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower().replace("_", "-"))


def match_known(path_or_name: str) -> str | None:
    """The known-architecture key a model path or name refers to ('/models/Llama-3.1-8B-Instruct' -> 'llama-3.1-8b')."""
    if path_or_name.startswith("bundled:"):
        path_or_name = path_or_name.split(":", 1)[1]
    base = _norm(path_or_name.rstrip("/").split("/")[-1])
    best = None
    for key in KNOWN_ARCHS:
        k = _norm(key)
        if base.startswith(k) and (best is None or len(k) > len(_norm(best))):
            best = key
    return best


def info_from_known(path_or_name: str):
    """A ModelInfo with the architecture facts of a known model (no weights, no files), or None."""
    from infertool.models.info import ModelInfo

    key = match_known(path_or_name)
    if key is None:
        return None
    a, src = KNOWN_ARCHS[key]
    return ModelInfo(path=f"{key} (published config: {src})", model_type=None, architectures=[], num_layers=a.layers,
                     hidden_size=a.hidden, intermediate_size=a.intermediate, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, head_dim=a.head_dim, vocab_size=a.vocab,
                     max_position_embeddings=MAX_POSITIONS.get(key), tie_word_embeddings=a.tie_word_embeddings,
                     dtype=None, stored_dtype=None, weight_bytes=0, weight_files=[], tensors=0, stored_parameters=0,
                     bytes_by_dtype={}, quantization=None, num_experts=a.num_experts,
                     num_experts_per_tok=a.experts_per_tok)


# The architectures (config.json "architectures") vLLM 0.32 generates text with: its registry's text-generation,
# multimodal and Transformers-backed models (vllm/model_executor/models/registry.py: _TEXT_GENERATION_MODELS,
# _MULTIMODAL_MODELS, _TRANSFORMERS_SUPPORTED_MODELS; tests/test_init.py checks the list against the installed
# vLLM). init plans only a model vLLM serves.
VLLM_ARCHITECTURES = frozenset(
    """
    AXK1ForCausalLM AfmoeForCausalLM ApertusForCausalLM ArceeForCausalLM AriaForConditionalGeneration
    AudioFlamingo3ForConditionalGeneration BagelForConditionalGeneration BailingMoeForCausalLM
    BailingMoeV2ForCausalLM BailingMoeV2_5ForCausalLM BailingMoeV3ForCausalLM
    BailingMoeV3VLForConditionalGeneration BeeForConditionalGeneration Blip2ForConditionalGeneration
    BloomForCausalLM ChatGLMForConditionalGeneration ChatGLMModel Cohere2ForCausalLM Cohere2MoeForCausalLM
    Cohere2VisionForConditionalGeneration CohereAsrForConditionalGeneration
    CohereCompassForConditionalGeneration CohereForCausalLM Cosmos3EdgeForConditionalGeneration
    Cosmos3ForConditionalGeneration CwmForCausalLM DbrxForCausalLM DeciLMForCausalLM DeepseekForCausalLM
    DeepseekOCR2ForCausalLM DeepseekOCRForCausalLM DeepseekV2ForCausalLM DeepseekV32ForCausalLM
    DeepseekV3ForCausalLM DeepseekV41ForCausalLM DeepseekV4ForCausalLM DeepseekV4ForConditionalGeneration
    DeepseekVLV2ForCausalLM DiffusionGemmaForBlockDiffusion Dots3NoteForCausalLM DotsOCRForCausalLM
    Eagle2_5_VLForConditionalGeneration Emu3ForConditionalGeneration Ernie4_5ForCausalLM Ernie4_5_MoeForCausalLM
    Ernie4_5_VLMoeForConditionalGeneration Exaone4ForCausalLM Exaone4_5_ForConditionalGeneration
    ExaoneForCausalLM ExaoneMoEForCausalLM ExaoneMoeForCausalLM FalconForCausalLM FalconH1ForCausalLM
    FalconMambaForCausalLM FireRedASR2ForConditionalGeneration FlexOlmoForCausalLM
    FunASRForConditionalGeneration FunAudioChatForConditionalGeneration GLM4VForCausalLM GPT2LMHeadModel
    GPTBigCodeForCausalLM GPTJForCausalLM GPTNeoXForCausalLM Gemma2ForCausalLM Gemma3ForCausalLM
    Gemma3ForConditionalGeneration Gemma3nForCausalLM Gemma3nForConditionalGeneration Gemma4ForCausalLM
    Gemma4ForConditionalGeneration Gemma4UnifiedForConditionalGeneration GemmaForCausalLM Glm4ForCausalLM
    Glm4MoeForCausalLM Glm4MoeLiteForCausalLM Glm4vForConditionalGeneration Glm4vMoeForConditionalGeneration
    Glm5NextForCausalLM Glm5NextForConditionalGeneration GlmAsrForConditionalGeneration GlmForCausalLM
    GlmMoeDsaForCausalLM GlmOcrForConditionalGeneration GptOssForCausalLM Granite4VisionForConditionalGeneration
    GraniteForCausalLM GraniteMoeForCausalLM GraniteMoeHybridForCausalLM GraniteMoeSWAForCausalLM
    GraniteMoeSharedForCausalLM GraniteSWAForCausalLM GraniteSpeechForConditionalGeneration
    GraniteSpeechPlusForConditionalGeneration H2OVLChatModel HCXVisionV2ForCausalLM HYV3ForCausalLM
    HYV4ForCausalLM HfMoondream HrmTextForCausalLM HunYuanDenseV1ForCausalLM HunYuanMoEV1ForCausalLM
    HunYuanVLForConditionalGeneration HyperCLOVAXForCausalLM IQuestCoderForCausalLM IQuestLoopCoderForCausalLM
    Idefics3ForConditionalGeneration InklingForCausalLM InklingForConditionalGeneration InternLM2ForCausalLM
    InternLM3ForCausalLM InternS1ForConditionalGeneration InternS1ProForConditionalGeneration
    InternS2MobiusForConditionalGeneration InternS2PreviewForConditionalGeneration InternVLChatModel
    InternVLForConditionalGeneration IsaacForConditionalGeneration Jais2ForCausalLM JambaForCausalLM
    K2HorizonForCausalLM KananaVForConditionalGeneration KeyeForConditionalGeneration
    KeyeVL1_5ForConditionalGeneration KimiK25ForConditionalGeneration KimiK3ForConditionalGeneration
    KimiLinearForCausalLM KimiVLForConditionalGeneration LLaMAForCausalLM LagunaForCausalLM Lfm2ForCausalLM
    Lfm2MoeForCausalLM Lfm2VlForConditionalGeneration LightOnOCRForConditionalGeneration Llama4ForCausalLM
    Llama4ForConditionalGeneration LlamaForCausalLM Llama_Nemotron_Nano_VL LlavaForConditionalGeneration
    LlavaNextForConditionalGeneration LlavaNextVideoForConditionalGeneration
    LlavaOnevision2ForConditionalGeneration LlavaOnevisionForConditionalGeneration LongcatFlashForCausalLM
    LongcatFlashNgramForCausalLM Mamba2ForCausalLM MambaForCausalLM MellumForCausalLM MiDashengLMModel
    MiMoForCausalLM MiMoV2FlashForCausalLM MiMoV2ForCausalLM MiMoV2OmniForCausalLM MiniCPM3ForCausalLM
    MiniCPMForCausalLM MiniCPMO MiniCPMV MiniCPMV4_6ForConditionalGeneration MiniCPMV4_7ForConditionalGeneration
    MiniMaxM2ForCausalLM MiniMaxM3SparseForCausalLM MiniMaxM3SparseForConditionalGeneration
    Ministral3ForCausalLM Mistral3ForConditionalGeneration MistralForCausalLM MistralLarge3ForCausalLM
    MixtralForCausalLM Molmo2ForConditionalGeneration MolmoForCausalLM Moondream3ForCausalLM
    MoonshotKimiaForCausalLM MossAudioModel MossTranscribeDiarizeForConditionalGeneration MuseGlimmerForCausalLM
    MuseGlimmerForConditionalGeneration NVLM_D NanbeigeForCausalLM NemotronForCausalLM NemotronHForCausalLM
    NemotronHPuzzleForCausalLM NemotronH_Nano_Omni_Reasoning_V3 NemotronH_Nano_VL_V2 NemotronH_Omni_Reasoning_V3
    NemotronH_Super_Omni_Reasoning_V3 NemotronParseForConditionalGeneration OPTForCausalLM Olmo2ForCausalLM
    Olmo3ForCausalLM OlmoForCausalLM OlmoHybridForCausalLM OlmoeForCausalLM OpenCUAForConditionalGeneration
    OpenPanguVLForConditionalGeneration OpenVLAForActionPrediction OrionForCausalLM Ovis Ovis2_5
    Ovis2_6ForCausalLM Ovis2_6_MoeForCausalLM PaddleOCRVLForConditionalGeneration
    PaliGemmaForConditionalGeneration PanguEmbeddedForCausalLM PanguProMoEV2ForCausalLM PanguUltraMoEForCausalLM
    Param2MoEForCausalLM Phi3ForCausalLM Phi3VForCausalLM Phi4ForCausalLMV Phi4MMForCausalLM PhiForCausalLM
    PhiMoEForCausalLM PixtralForConditionalGeneration Plamo3ForCausalLM QianfanOCRForConditionalGeneration
    Qwen2AudioForConditionalGeneration Qwen2ForCausalLM Qwen2MoeForCausalLM Qwen2VLForConditionalGeneration
    Qwen2_5OmniForConditionalGeneration Qwen2_5OmniModel Qwen2_5_VLForConditionalGeneration
    Qwen3ASRForConditionalGeneration Qwen3ASRRealtimeGeneration Qwen3ForCausalLM Qwen3MoeForCausalLM
    Qwen3NextForCausalLM Qwen3OmniMoeForConditionalGeneration Qwen3VLForConditionalGeneration
    Qwen3VLMoeForConditionalGeneration Qwen3_5ForCausalLM Qwen3_5ForConditionalGeneration Qwen3_5MoeForCausalLM
    Qwen3_5MoeForConditionalGeneration Qwen4ExpForCausalLM Qwen4ExpForConditionalGeneration
    RForConditionalGeneration Rnj1ForCausalLM SarvamMLAForCausalLM SarvamMoEForCausalLM SeedOssForCausalLM
    SkyworkR1VChatModel SmolLM3ForCausalLM SmolVLMForConditionalGeneration SolarForCausalLM StableLmForCausalLM
    Starcoder2ForCausalLM Step1ForCausalLM Step3TextForCausalLM Step3VLForConditionalGeneration
    Step3p5ForCausalLM Step3p7ForConditionalGeneration StepVLForConditionalGeneration TeleChat2ForCausalLM
    TeleChat3ForCausalLM TeleFLMForCausalLM UltravoxModel UnlimitedOCRForCausalLM VaultGemmaForCausalLM
    VibeVoiceAsrForConditionalGeneration VoxtralForConditionalGeneration VoxtralRealtimeGeneration
    WhisperForConditionalGeneration Zamba2ForCausalLM
    """.split()
)
