"""Models: one loader for the bundled tiny Qwen and for any Hub model, device and precision.

``load_model_and_tokenizer("tiny")`` gives a ``Qwen2ForCausalLM`` of about 0.3M
parameters with a character-level tokenizer that carries Qwen's chat special
tokens and a Qwen-style chat template. Everything downstream
(``apply_chat_template``, ``generate``, the log-prob code) is the same line of
code for it and for ``Qwen/Qwen2.5-0.5B-Instruct``.

Precision. The policy keeps fp32 weights everywhere: AdamW updates of ~1e-6 x
a weight vanish when added to a bf16 weight (8 bits of mantissa). On a GPU
with bf16 (A100, H100, L4) forward passes run under bf16 autocast; on a T4
(no bf16; fp16 activations of Qwen2 can overflow) they stay in fp32. The
frozen reference model needs no updates, so it is stored in bf16 where
supported.
"""

from __future__ import annotations

import contextlib
import copy
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


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bf16 on a GPU that supports it; None (plain fp32) on a T4 and on the CPU."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


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

    Stored in bf16 where the device supports it (it is never updated).
    """
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    dtype = autocast_dtype(next(model.parameters()).device)
    return reference.to(dtype) if dtype is not None else reference


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
