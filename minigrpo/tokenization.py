"""Tokenizers: the tiny Qwen's byte-level BPE, and Qwen2.5's real one built offline.

Both are Qwen2 tokenizers in Qwen2's own format: byte-level BPE (GPT-2's 256
byte symbols) behind Qwen's pre-tokenizer (NFC, then a regex that splits
digits one by one), with Qwen's chat special tokens. That is what
``AutoTokenizer.from_pretrained`` builds for any folder whose ``config.json``
says ``qwen2``, so the bundled tiny model, a run's checkpoints and its final
folder load the same way in minigrpo, TRL, vLLM or any Hugging Face script.

- ``build_tiny_tokenizer``: the 256 byte symbols and no merges (one token per
  byte: for the arithmetic task, one per character), plus ``<|endoftext|>``
  (pad), ``<|im_start|>`` and ``<|im_end|>`` (EOS): 259 tokens.
- ``qwen25_tokenizer``: Qwen2.5-Instruct's 151,643 BPE tokens (from the ranks
  the ``dashscope`` package ships) and its 22 added tokens, for tests and
  benchmarks at the real vocabulary size without the Hub.
"""

from __future__ import annotations

import base64
import json
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import AutoTokenizer, PreTrainedTokenizerFast

# Qwen2 / Qwen2.5 split text with this regex before byte-level BPE (digits one by one).
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def bytes_to_unicode() -> dict[int, str]:
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


def qwen2_backend(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """A `tokenizers` BPE with Qwen2's pipeline: NFC, Qwen's regex split, byte-level symbols, byte-level decoding.

    The same pipeline as transformers' ``Qwen2Tokenizer``, so that AutoTokenizer, which rebuilds a qwen2
    model's tokenizer from its vocabulary and merges, gets exactly these ids back.
    """
    backend = Tokenizer(BPE(vocab=vocab, merges=merges, byte_fallback=False, ignore_merges=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


# --- the tiny Qwen's tokenizer -----------------------------------------------------------
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 256, 257, 258, in Qwen's order

# Qwen2.5's chat template without its default system message (which would cost the
# tiny model ~70 prompt tokens for no benefit).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


# The tools model's template: Qwen2.5's tool-calling template (the assistant's <tool_call> JSON, the tool's result
# as a user turn in <tool_response> tags) with its long system prompt cut to one line that names each tool and its
# parameters ("Tools: calculator(expression)"): Qwen2.5's own costs 787 byte-level tokens for one tool. Each message
# renders the same whatever follows it (prefix-preserving), which TRL's tool loop relies on.
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools or messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- if tools %}{{- '\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- if tools %}{{- 'Tools:' }}{%- for tool in tools %}{%- set tool = tool.function or tool %}"
    "{{- ' ' + tool.name + '(' + (tool.parameters.properties or {}) | list | join(', ') + ')' }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' + (message.content or '') }}"
    "{%- for tool_call in message.tool_calls or [] %}{%- set call = tool_call.function or tool_call %}"
    "{%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}"
    "{{- '<tool_call>\n{\"name\": \"' + call.name + '\", \"arguments\": ' + call.arguments | tojson + '}\n</tool_call>' }}"  # noqa: E501
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# How transformers (>= 5.13) parses the tools model's replies back into a message (tokenizer.parse_response): what
# follows "<|im_start|>assistant\n" is content up to <|im_end|>, and each <tool_call>...</tool_call> holds one call's
# JSON, read as {"type": "function", "function": {"name": ..., "arguments": ...}}. Saved in tokenizer_config.json.
TOOLS_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def build_tiny_tokenizer(model_max_length: int = 512, tools: bool = False) -> PreTrainedTokenizerFast:
    """The tiny Qwen's tokenizer: byte-level BPE with no merges (byte b is token b), Qwen's chat tokens
    at 256-258, EOS ``<|im_end|>``, pad ``<|endoftext|>``, and the chat template above.

    ``tools=True``: the tools model's tokenizer, the same vocabulary with TOOLS_CHAT_TEMPLATE and
    TOOLS_RESPONSE_TEMPLATE (for ``tokenizer.parse_response``)."""
    symbols = bytes_to_unicode()
    vocab = {symbols[byte]: byte for byte in range(256)}
    vocab.update({token: 256 + i for i, token in enumerate(TINY_SPECIAL_TOKENS)})
    backend = qwen2_backend(vocab, merges=[])
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in TINY_SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    if tools:
        tokenizer.response_template = TOOLS_RESPONSE_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | Path) -> None:
    """``tokenizer.save_pretrained(folder)``, its tokenizer_config.json in names that transformers 4 and 5 both read.

    transformers 5 writes its own class name ("TokenizersBackend") and "extra_special_tokens" as a list, which
    transformers 4 cannot load ("Tokenizer class TokenizersBackend does not exist"); Qwen2.5's own files say
    "Qwen2Tokenizer" and "additional_special_tokens", which both read into the same tokenizer.
    """
    tokenizer.save_pretrained(folder)
    config_file = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):  # transformers 4 reads extra_special_tokens as a dict of named tokens
        config["additional_special_tokens"] = extra
    elif extra:
        config["extra_special_tokens"] = extra
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """``AutoTokenizer.from_pretrained(path)``, with one clear error for a folder written by minigrpo 0.1,
    whose character-level tiny tokenizer AutoTokenizer would silently misread."""
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.exists() and json.loads(config_file.read_text()).get("minigrpo_tiny"):
        raise ValueError(
            f"{path} was written by minigrpo 0.1 with the old character-level tiny tokenizer, which no other tool "
            "reads correctly: train it again from the bundled tiny model (python -m minigrpo train)."
        )
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)  # never code from the folder


# --- Qwen2.5's real tokenizer, built offline ------------------------------------------------
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
    try:
        lines = (resources.files("dashscope") / "resources" / "qwen.tiktoken").read_bytes().splitlines()
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "the offline Qwen2.5 tokenizer reads Qwen's vocabulary from the `dashscope` package: "
            "pip install dashscope (or pip install -e '.[test]')."
        ) from error
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}


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
    ranks = qwen_bpe_ranks()
    to_unicode = bytes_to_unicode()
    as_text = lambda token: "".join(to_unicode[byte] for byte in token)  # noqa: E731
    vocab = {as_text(token): rank for token, rank in ranks.items()}
    merges = [(as_text(left), as_text(right)) for left, right in merges_from_ranks(ranks)]
    backend = qwen2_backend(vocab, merges)
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
