"""Models: one loader for the bundled tiny Qwen and for any Hub model, device and precision.

``load_model_and_tokenizer("tiny")`` gives a ``Qwen2ForCausalLM`` of about 0.26M
parameters with a byte-level Qwen2 tokenizer (``minigrpo.tokenization``) that
carries Qwen's chat special tokens and a Qwen-style chat template. Everything downstream
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

LoRA (Hu et al., arXiv 2106.09685) through PEFT: ``add_adapters`` wraps the
policy so that each targeted weight W (out x in) becomes W + (alpha / r) B A
with A (r x in) and B (out x r) trained and W frozen. The reference policy is
then the same model with its adapters switched off (``AdaptersDisabled``): the
KL term needs no second copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import sys
import warnings
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from minigrpo.tokenization import build_tiny_tokenizer, load_tokenizer  # noqa: F401 (build_tiny_tokenizer re-exported)

TINY_MODEL_DIR = Path(__file__).parent / "assets" / "tiny-qwen"
TINY_TOOLS_MODEL_DIR = Path(__file__).parent / "assets" / "tiny-qwen-tools"  # the calculator task's tool caller
BUNDLED_MODELS = {
    "tiny": (TINY_MODEL_DIR, "pretrain-tiny"),
    "tiny-tools": (TINY_TOOLS_MODEL_DIR, "pretrain-tiny --tools"),
}
QWEN_MODEL_ID = "Qwen/Qwen2.5-0.5B-Instruct"
ADAPTER_CONFIG_FILE = "adapter_config.json"  # what PEFT's save_pretrained writes beside the adapter weights


class _DropBitsandbytesCpuKernelProbe(logging.Filter):
    """Drops the two log lines of bitsandbytes' search for an optional CPU kernel, and nothing else.

    bitsandbytes (the qlora extra) is imported by peft, which transformers' trainer modules import. On a CPU with
    AVX-512 BF16 it then asks the Hub, through the kernels package, for a CPU kernel, and logs a warning when it
    cannot have one (offline, or a publisher that cannot be verified). minigrpo runs bitsandbytes only for 4-bit
    weights on CUDA, so those lines say nothing about a run; in a lesson they land in the middle of its output.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        probe_failed = message.startswith("Failed to load CPU gemm_4bit_forward")  # bitsandbytes' line
        trust_skipped = message.startswith("Skipping publisher trust check") and "quantization-bitsandbytes" in message
        return not (probe_failed or trust_skipped)


for _probe_logger in ("bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):  # the loggers of those lines
    logging.getLogger(_probe_logger).addFilter(_DropBitsandbytesCpuKernelProbe())


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


def autocast_dtype(device: torch.device, bf16: bool | None = None) -> torch.dtype | None:
    """bf16 on a GPU with native bf16; None (plain fp32) on a T4, a V100 and the CPU.

    ``bf16`` is GRPOConfig.bf16 (TRL's name): None decides by the hardware, False forces fp32, and True asks
    for bf16, which is granted only where it is native (elsewhere fp32; the trainer warns once)."""
    if bf16 is False:
        return None
    return torch.bfloat16 if native_bf16(device) else None


def check_bf16_request(device: torch.device, bf16: bool | None) -> None:
    """Warn when bf16=True meets hardware without native bf16: minigrpo then trains in fp32."""
    if bf16 and not native_bf16(device):
        warnings.warn(
            f"bf16=True, but {device} has no native bf16 (a T4 or V100 emulates it, slower than fp32; the CPU path "
            "is fp32): training in fp32. Set bf16=None (auto) or False to silence this.",
            stacklevel=3,
        )


def precision_context(device: torch.device, bf16: bool | None = None):
    """The autocast context every forward pass and `generate` call runs under (bf16: see autocast_dtype)."""
    dtype = autocast_dtype(device, bf16)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def default_model_name() -> str:
    """The real Qwen on a GPU, the bundled tiny Qwen on a CPU."""
    return QWEN_MODEL_ID if torch.cuda.is_available() else "tiny"


# --- the tiny Qwen ------------------------------------------------------------------
def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    seed: int = 0,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM small enough to train on a laptop CPU.

    The defaults are the bundled tiny Qwen's; the tools model is wider (TINY_TOOLS_MODEL_SIZE).
    ``intermediate_size`` defaults to 4 x hidden_size; 4 attention heads, 2 key-value heads."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
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
    name: str = "tiny",
    device: torch.device | str | None = None,
    load_in_4bit: bool = False,
    model_init_kwargs: dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer, in fp32, on `device` (default: pick_device()).

    ``name``: "tiny" for the bundled tiny Qwen (offline), "tiny-tools" for the bundled tools model (the
    calculator task: ``minigrpo.tasks.calculator``), or a Hub id such as
    "Qwen/Qwen2.5-0.5B-Instruct", or a local directory written by save_pretrained.
    A folder of LoRA adapters (it has adapter_config.json, as ``save_model(path)``
    writes for a LoRA run) loads the base model it names, then the adapters on
    top: a PeftModel whose adapters can be trained further.

    ``load_in_4bit``: QLoRA (Dettmers et al., arXiv 2305.14314): the frozen base
    weights in 4-bit NF4 through bitsandbytes, CUDA only; train it with a
    ``peft_config`` (a 4-bit weight cannot be updated itself).

    ``model_init_kwargs``: extra keywords for ``from_pretrained`` (GRPOConfig.model_init_kwargs, TRL's field),
    such as ``revision`` or ``dtype`` ("bfloat16", "float32", "auto"); None values are dropped, and
    ``trust_remote_code=True`` is refused: minigrpo never runs code shipped in a model folder.
    """
    device = torch.device(device) if device is not None else pick_device()
    path = str(BUNDLED_MODELS[name][0]) if name in BUNDLED_MODELS else name
    if name in BUNDLED_MODELS and not (Path(path) / "config.json").exists():
        raise FileNotFoundError(
            f"the bundled {name} model is missing from {path}: "
            f"rebuild it with `python -m minigrpo {BUNDLED_MODELS[name][1]}`."
        )
    if (Path(path) / ADAPTER_CONFIG_FILE).exists():
        return load_adapters_and_tokenizer(path, device, load_in_4bit)
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token is None:  # some base models ship without one
        tokenizer.pad_token = tokenizer.eos_token
    if load_in_4bit:
        return load_4bit(path, device), tokenizer
    kwargs = {"dtype": torch.float32, **init_kwargs(model_init_kwargs), "trust_remote_code": False}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    check_model_and_tokenizer(model, tokenizer, path)
    return model.to(device), tokenizer


def check_model_and_tokenizer(model: PreTrainedModel, tokenizer, where: str) -> None:
    """Fail at once, naming `where` (the folder or name), for a model that cannot be trained with `tokenizer`:
    weights that are not floating point (integers cannot be updated by gradients, and the forward pass would
    silently compute in integers or fail deep inside), or a vocabulary smaller than the tokenizer's (a token id
    >= V indexes past the embedding: an assertion deep in torch). 4-bit and 8-bit models store integers on
    purpose and are exempt."""
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
    integer = [name for name, p in model.named_parameters() if not p.is_floating_point()]
    if integer and not quantized:
        dtype = dict(model.named_parameters())[integer[0]].dtype
        raise ValueError(
            f"{where}: {len(integer)} weight(s) are of type {dtype} (e.g. {integer[0]}), not floating point: "
            "they cannot be trained or run in fp32. Save the model with float weights (model.float())."
        )
    vocabulary = model.get_input_embeddings().num_embeddings
    if vocabulary < len(tokenizer):
        raise ValueError(
            f"{where}: the model's vocabulary has {vocabulary} tokens but the tokenizer has {len(tokenizer)}, so a "
            "token id past the embedding would crash the forward pass. Use the tokenizer saved with this model, "
            "or call model.resize_token_embeddings(len(tokenizer)) before training."
        )


def init_kwargs(model_init_kwargs: dict | None) -> dict:
    """GRPOConfig.model_init_kwargs as from_pretrained keywords: None values dropped, a dtype name turned into
    the torch dtype ("auto" stays), trust_remote_code=True refused."""
    kwargs = {k: v for k, v in (model_init_kwargs or {}).items() if v is not None}
    if kwargs.pop("trust_remote_code", False):
        raise ValueError(
            "model_init_kwargs has trust_remote_code=True: minigrpo never runs code shipped in a model folder. "
            "Use a model whose architecture transformers implements (Qwen2 and its kin), and drop the keyword."
        )
    dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"model_init_kwargs has dtype={dtype!r}: give a torch dtype name such as 'float32'.")
        dtype = getattr(torch, dtype)
    return kwargs if dtype is None else {**kwargs, "dtype": dtype}


def load_adapters_and_tokenizer(folder: str, device: torch.device, load_in_4bit: bool = False):
    """A folder of LoRA adapters -> (PeftModel on its base model, tokenizer). The base is the model that
    adapter_config.json names (base_model_name_or_path); the tokenizer is the folder's own when it has one.
    A base that is itself an adapter folder is followed (adapters on adapters), never in a circle."""
    from peft import PeftModel

    base_name = adapter_base(folder)
    base, tokenizer = load_model_and_tokenizer(base_name, device, load_in_4bit)
    if (Path(folder) / "tokenizer_config.json").exists():
        tokenizer = load_tokenizer(folder)
    return PeftModel.from_pretrained(base, folder, is_trainable=True), tokenizer


def adapter_base(folder: str | Path) -> str:
    """The base model an adapter folder names (base_model_name_or_path in adapter_config.json), checked: named at
    all; a folder that still exists where it was recorded (a moved base model gives the path to fix); and not the
    folder itself or a chain of adapter folders that comes back to it (which would recurse without end)."""
    from peft import PeftConfig

    seen, current, direct_base = [], Path(folder), None
    while True:
        seen.append(current.expanduser().resolve())
        base = PeftConfig.from_pretrained(str(current)).base_model_name_or_path
        where = f"{current / ADAPTER_CONFIG_FILE}"
        if not base:
            raise ValueError(
                f"{where} names no base model (base_model_name_or_path is empty): set it to the Hub id or folder "
                "of the model the adapters were trained on."
            )
        looks_like_path = base.startswith(("/", ".", "~")) or "\\" in base or base.count("/") > 1
        if base != "tiny" and looks_like_path and not Path(base).expanduser().exists():
            raise FileNotFoundError(
                f"{where} names its base model {base} (base_model_name_or_path), which does not exist: the base "
                f"model was moved or deleted. Set base_model_name_or_path in {where} to the base model's folder "
                "now, or its Hub id."
            )
        direct_base = direct_base or base
        if not (Path(base).expanduser() / ADAPTER_CONFIG_FILE).exists():
            return direct_base
        if Path(base).expanduser().resolve() in seen:
            chain = " -> ".join(str(p) for p in [*seen, Path(base).expanduser().resolve()])
            raise ValueError(
                f"{where} names {base} as its base model, which leads back to an adapter folder already on the way "
                f"({chain}): set base_model_name_or_path to the model the adapters were trained on."
            )
        current = Path(base)


def load_4bit(path: str, device: torch.device) -> PreTrainedModel:
    """The base model in 4-bit NF4 with double quantization (QLoRA's recipe); matmuls in fp16 on a T4 / V100,
    bf16 where the GPU has it natively. Norms stay fp32 and checkpointing is prepared (PEFT's
    prepare_model_for_kbit_training). CUDA with bitsandbytes only: a clear error anywhere else."""
    if device.type != "cuda":
        raise ValueError(
            f"load_in_4bit=True needs a CUDA GPU (bitsandbytes' 4-bit kernels), but the device is {device}: "
            "on a CPU load the model in fp32 (load_in_4bit=False) and train it with a peft_config (LoRA)."
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise ImportError("load_in_4bit=True needs bitsandbytes: pip install bitsandbytes") from error
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=autocast_dtype(device) or torch.float16,
    )
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quantization, device_map={"": device})
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # the trainer sets it


# --- LoRA (PEFT) ----------------------------------------------------------------------
# The seven linear layers of every Qwen2 decoder layer: what TRL's and Unsloth's GRPO notebooks adapt.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(r: int = 16, lora_alpha: int = 32, lora_dropout: float = 0.0, target_modules=LORA_TARGET_MODULES):
    """A peft.LoraConfig for a Qwen2 policy: rank r on the attention and MLP projections, scale alpha / r = 2.

    r=16, alpha=32 are TRL's defaults (trl.ModelConfig's lora_r and lora_alpha; Unsloth's GRPO notebooks use r = 32
    to 64). Give LoRA about 10x the full fine-tuning learning rate, whatever r (Schulman et al., "LoRA Without
    Regret", Thinking Machines, 2025; lesson 06). Dropout is 0 on purpose: completions are sampled
    without dropout, and a dropout mask in the update would score them under a slightly different policy.
    """
    from peft import LoraConfig

    return LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )


def is_peft_model(model) -> bool:
    """True for a model wrapped with adapters by PEFT (a PeftModel).

    Imports nothing: a PeftModel can only exist once peft is imported, and importing peft just to ask takes seconds
    and imports bitsandbytes where it is installed, which on CPUs with AVX-512 BF16 looks for a kernel on the Hub and
    logs to stderr (a line in the middle of a lesson's output)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def add_adapters(model: PreTrainedModel, peft_config, seed: int = 0) -> PreTrainedModel:
    """The policy with LoRA adapters (peft.get_peft_model): only the adapters are trainable, the base is frozen.

    A starts random (B at zero), drawn from a generator seeded with `seed` (GRPOConfig.seed) and
    forked from the global one: the same adapters however much randomness was used before, which
    an exact resume and a repeatable run need.

    The output head must stay a plain Linear: the log-prob code multiplies hidden
    states by its weight directly (minigrpo.logprobs.project_to_logps), which
    would skip an adapter on it.
    """
    from peft import get_peft_model

    if is_peft_model(model):
        raise ValueError(
            "the model already has PEFT adapters and a peft_config was given too: pass either the PeftModel "
            "(peft_config=None) or the plain model with a peft_config."
        )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, peft_config)
    if type(wrapped.get_output_embeddings()) is not torch.nn.Linear:
        raise ValueError(
            "peft_config adapts the output head (lm_head): minigrpo computes log-probs from the head's weight "
            "directly, which would skip the adapter. Remove lm_head from target_modules and modules_to_save."
        )
    return wrapped


class AdaptersDisabled:
    """pi_ref of a LoRA policy: the policy itself with its adapters switched off, W instead of W + (alpha/r) BA.

    It stands where a frozen reference copy would (``sample_group_rollout(..., ref_model)``):
    calling it runs the policy under ``disable_adapter()`` in eval mode. Everything else
    (``get_output_embeddings``, ``forward``'s signature) is the policy's. It owns no weights:
    the memory of a second model is saved.
    """

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, *args, **kwargs):
        was_training = self.policy.training
        self.policy.eval()  # as the frozen copy: no dropout
        try:
            with self.policy.disable_adapter():
                return self.policy(*args, **kwargs)
        finally:
            self.policy.train(was_training)

    def __getattr__(self, name: str):
        return getattr(self.policy, name)


def make_reference_model(model: PreTrainedModel, bf16: bool | None = None) -> PreTrainedModel | AdaptersDisabled:
    """A frozen copy of the policy before training: pi_ref in the KL term.

    A LoRA policy (a PeftModel) needs no copy: its base weights are frozen, so
    pi_ref is the same model with the adapters off (AdaptersDisabled).
    Otherwise the copy is stored in bf16 where the GPU has native bf16 (it is never updated, and its
    forward passes run under bf16 autocast there anyway); fp32 on a T4 and the CPU.
    Always without activation checkpointing: it never runs a backward pass.
    """
    if is_peft_model(model):
        return AdaptersDisabled(model)
    reference = copy.deepcopy(model).eval()
    reference.requires_grad_(False)
    set_gradient_checkpointing(reference, False)
    dtype = autocast_dtype(next(model.parameters()).device, bf16)
    return reference.to(dtype) if dtype is not None else reference


def set_gradient_checkpointing(model: PreTrainedModel, enabled: bool) -> None:
    """Turn activation (gradient) checkpointing of the decoder layers on or off.

    On: each layer keeps only its input in the forward pass and recomputes its
    activations in the backward pass: about 1/3 more compute for roughly
    1 / (activations per layer) of the activation memory. It acts only in
    training mode with gradients enabled, so `generate` and the no-grad
    reference / old log-prob passes run as without it. Non-reentrant
    checkpointing (use_reentrant=False) needs no `enable_input_require_grads`
    for full fine-tuning. With frozen embeddings (LoRA) it is switched on all the
    same, as PEFT and TRL do: the embeddings' output then requires grad, which
    reentrant checkpointing (any layer that a user's setting makes reentrant) needs
    to send gradients into the layers at all.
    """
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    if not enabled:
        if gradient_checkpointing_is_on(model):
            disable()
        return
    if not model.get_input_embeddings().weight.requires_grad:  # frozen embeddings (LoRA)
        model.enable_input_require_grads()
    kwargs = {"use_reentrant": False}
    if "activation_checkpointing_kwargs" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.x
        enable(gradient_checkpointing_kwargs=kwargs)


def gradient_checkpointing_is_on(model: PreTrainedModel) -> bool:
    """Whether activation checkpointing is on (transformers 5 names it `is_activation_checkpointing`, 4.x
    `is_gradient_checkpointing`)."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def disable_dropout(model: torch.nn.Module) -> None:
    """Every dropout probability to 0 (GRPOConfig.disable_dropout, TRL's name): the log-probs of the update
    then match the rollout's. Qwen2 has no dropout by default (attention_dropout 0.0)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if hasattr(getattr(model, "config", None), "attention_dropout"):
        model.config.attention_dropout = 0.0


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- the model argument: a model or a name, as in TRL ----------------------------------
def resolve_model_and_tokenizer(
    model, processing_class=None, model_init_kwargs: dict | None = None, quantization_config=None, use_cpu: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``model`` may be a name ("tiny", a Hub id, a folder): load it (and its tokenizer) with
    load_model_and_tokenizer, with model_init_kwargs, in 4-bit when quantization_config asks for it (TRL's
    trainer keyword). For a model object without ``processing_class``, load the tokenizer saved with it
    (``model.name_or_path``), as TRL does. use_cpu: load onto the CPU even where there is a GPU."""
    if isinstance(model, str | Path):
        load_in_4bit = bool(getattr(quantization_config, "load_in_4bit", False))
        device = "cpu" if use_cpu else None
        model, tokenizer = load_model_and_tokenizer(str(model), device, load_in_4bit, model_init_kwargs)
        return model, processing_class if processing_class is not None else tokenizer
    if quantization_config is not None:
        raise ValueError(
            "quantization_config applies when the model is given by name: pass the name (or folder) as model, "
            "or load the model in 4-bit yourself (load_model_and_tokenizer(name, load_in_4bit=True))."
        )
    if processing_class is None:
        name = getattr(model, "name_or_path", "")
        if not name:
            raise ValueError(
                "processing_class is None and the model has no name_or_path: pass processing_class=tokenizer."
            )
        processing_class = load_tokenizer(name)
    check_model_and_tokenizer(model, processing_class, f"model {type(model).__name__}")
    return model, processing_class
