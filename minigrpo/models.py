"""Models: one loader for the bundled tiny Qwen and for any Hub model, device and precision.

``load_model_and_tokenizer("tiny")`` gives a ``Qwen2ForCausalLM`` of about 0.3M
parameters with a character-level tokenizer that carries Qwen's chat special
tokens and a Qwen-style chat template. Everything downstream
(``apply_chat_template``, ``generate``, the log-prob code) is the same line of
code for it and for ``Qwen/Qwen2.5-0.5B-Instruct``.

Precision. The policy keeps fp32 weights everywhere: AdamW updates of ~1e-6 x
a weight vanish when added to a bf16 weight (8 bits of mantissa). On a GPU
with *native* bf16 (compute capability >= 8.0: A100, L4, H100) forward passes
run under bf16 autocast; on a T4 or V100 (7.x: bf16 only emulated, slowly;
fp16 activations of Qwen2 can overflow) and on the CPU they stay in fp32. The
frozen reference model needs no updates, so it is stored in bf16 exactly
where autocast runs in bf16.

Pitfall: ``torch.cuda.is_bf16_supported()`` counts *emulated* bf16 by default
and says True on a T4; ``native_bf16`` asks for native support only.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_MODEL_DIR = Path(__file__).parent / "assets" / "tiny-qwen"
QWEN_MODEL_ID = "Qwen/Qwen2.5-0.5B-Instruct"

# Qwen's special tokens, and every character the arithmetic task and a chat need.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARACTERS = list(" \n0123456789+-*/=?.,:;!'\"()<>_") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
CHARACTERS += [chr(c) for c in range(ord("A"), ord("Z") + 1)]

# Qwen2.5's chat template without its default system message (which would
# cost the character-level tiny model ~70 prompt tokens for no benefit).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


# --- device and precision -----------------------------------------------------------
def pick_device() -> torch.device:
    """CUDA when there is a GPU, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def native_bf16(device: torch.device | str) -> bool:
    """True only on a CUDA GPU with native bf16 (compute capability >= 8.0: A100, L4, H100).

    A T4 (7.5) or V100 (7.0) emulates bf16: slower than fp32, and
    ``torch.cuda.is_bf16_supported()`` still says True there unless asked with
    ``including_emulation=False`` (torch >= 2.3). Older torch: read the capability.
    """
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.3 has no including_emulation argument
        major, _ = torch.cuda.get_device_capability(device)
        return major >= 8


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 on a GPU with native bf16; None (plain fp32) on a T4, a V100 and the CPU."""
    return torch.bfloat16 if native_bf16(device) else None


def precision_context(device: torch.device):
    """The autocast context every forward pass and `generate` call runs under."""
    dtype = autocast_dtype(device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def default_model_name() -> str:
    """The real Qwen on a GPU, the bundled tiny Qwen on a CPU."""
    return QWEN_MODEL_ID if torch.cuda.is_available() else "tiny"


# --- the tiny Qwen ------------------------------------------------------------------
def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with Qwen's chat special tokens and chat template."""
    return character_tokenizer({token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)})


def character_tokenizer(vocab: dict[str, int], model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """One token per character of `vocab` (which must hold Qwen's chat tokens and "<unk>"), Qwen's chat template."""
    from tokenizers import Tokenizer, decoders, models

    # BPE with no merges = one token per character; Fuse() joins them back without spaces.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.init_kwargs["minigrpo_tiny"] = True  # saved in tokenizer_config.json; see load_tokenizer
    return tokenizer


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM small enough to train on a laptop CPU."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    return model


# --- loading ------------------------------------------------------------------------
def load_model_and_tokenizer(
    name: str = "tiny", device: torch.device | str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer, in fp32, on `device` (default: pick_device()).

    ``name``: "tiny" for the bundled tiny Qwen (offline), or a Hub id such as
    "Qwen/Qwen2.5-0.5B-Instruct", or a local directory written by save_pretrained.
    """
    device = torch.device(device) if device is not None else pick_device()
    path = str(TINY_MODEL_DIR) if name == "tiny" else name
    if name == "tiny" and not (TINY_MODEL_DIR / "config.json").exists():
        raise FileNotFoundError(
            f"the bundled tiny model is missing from {TINY_MODEL_DIR}: "
            "rebuild it with `python -m minigrpo pretrain-tiny`."
        )
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if tokenizer.pad_token is None:  # some base models ship without one
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def load_tokenizer(path: str) -> PreTrainedTokenizerFast:
    """AutoTokenizer, except for the tiny Qwen's character-level tokenizer.

    AutoTokenizer picks the tokenizer class from the model type (qwen2) and
    would rebuild Qwen's byte-level pre-tokenizer around our character
    vocabulary; the tiny tokenizer is loaded exactly as saved instead.
    """
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.exists() and json.loads(config_file.read_text()).get("minigrpo_tiny"):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def make_reference_model(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen copy of the policy before training: pi_ref in the KL term.

    Stored in bf16 where the GPU has native bf16 (it is never updated, and its
    forward passes run under bf16 autocast there anyway); fp32 on a T4 and the CPU.
    Always without activation checkpointing: it never runs a backward pass.
    """
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    set_gradient_checkpointing(reference, False)
    dtype = autocast_dtype(next(model.parameters()).device)
    return reference.to(dtype) if dtype is not None else reference


def set_gradient_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Turn activation (gradient) checkpointing of the decoder layers on or off.

    On: each layer keeps only its input in the forward pass and recomputes its
    activations in the backward pass: about 1/3 more compute for roughly
    1 / (activations per layer) of the activation memory. It acts only in
    training mode with gradients enabled, so `generate` and the no-grad
    reference / old log-prob passes run as without it. Non-reentrant
    checkpointing (use_reentrant=False) needs no `enable_input_require_grads`
    for full fine-tuning (that is for frozen embeddings, e.g. LoRA).
    """
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    if not enabled:
        name = (
            "is_activation_checkpointing"
            if hasattr(model, "is_activation_checkpointing")
            else "is_gradient_checkpointing"
        )
        if getattr(model, name):
            disable()
        return
    kwargs = {"use_reentrant": False}
    if "activation_checkpointing_kwargs" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.x
        enable(gradient_checkpointing_kwargs=kwargs)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- the real Qwen2.5 tokenizer, built offline ------------------------------------------
# Qwen2 / Qwen2.5 split text with this regex before byte-level BPE (digits one by one).
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The 22 added tokens of Qwen2.5, ids 151643..151664; the last 8 are not "special" (decoded like text).
QWEN25_ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
QWEN25_NUM_SPECIAL = 14
# Qwen2.5-Instruct's chat template (tool calls included), with its default system prompt.
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501


def qwen_bpe_ranks() -> dict[bytes, int]:
    """Qwen's 151,643 byte-level BPE ranks (token bytes -> id), from the `dashscope` package's qwen.tiktoken."""
    import base64
    from importlib import resources

    try:
        lines = (resources.files("dashscope") / "resources" / "qwen.tiktoken").read_bytes().splitlines()
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "the offline Qwen2.5 tokenizer reads Qwen's vocabulary from the `dashscope` package: "
            "pip install dashscope (or pip install -e '.[test]')."
        ) from error
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 bytes to printable characters (the alphabet of byte-level BPE vocabularies)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover BPE merges from tiktoken-style ranks: token = left + right with both parts in the vocabulary.

    A token of rank r is made by merging two tokens of lower rank; every such split is
    listed, ordered by r and then by the ranks of the parts (as transformers' tiktoken
    converter does), so that HF's BPE applies merges in tiktoken's order.
    """
    merges = []
    for token, rank in ranks.items():
        splits = [
            (token[:i], token[i:], rank)
            for i in range(1, len(token))
            if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank
        ]
        merges.extend(sorted(splits, key=lambda split: (ranks[split[0]], ranks[split[1]])))
    merges.sort(key=lambda merge: merge[2])
    return [(left, right) for left, right, _ in merges]


def qwen25_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Qwen2.5-Instruct's tokenizer, built offline: 151,643 byte-level BPE tokens + 22 added tokens.

    Same vocabulary, merges, pre-tokenizer (NFC, Qwen's regex, byte level),
    special tokens (eos <|im_end|>, pad <|endoftext|>) and chat template (with its
    default system prompt) as `AutoTokenizer.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")`.
    With `cache_dir`, it is saved there on first use and loaded from there afterwards.
    """
    if cache_dir is not None and (Path(cache_dir) / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(cache_dir))
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ranks = qwen_bpe_ranks()
    to_unicode = _bytes_to_unicode()
    as_text = lambda token: "".join(to_unicode[byte] for byte in token)  # noqa: E731
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for left, right in merges_from_ranks(ranks)]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(
        [
            AddedToken(token, special=i < QWEN25_NUM_SPECIAL, normalized=False)
            for i, token in enumerate(QWEN25_ADDED_TOKENS)
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=QWEN25_ADDED_TOKENS[1:QWEN25_NUM_SPECIAL],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    if cache_dir is not None:
        tokenizer.save_pretrained(str(cache_dir))
    return tokenizer
