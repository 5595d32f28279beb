"""Device and precision choice (mocked GPUs), the reference model, gradient checkpointing, and what importing the
optional libraries (peft, bitsandbytes) costs a run that does not use them."""

import logging
import subprocess
import sys

import pytest
import torch

from minigrpo import models
from minigrpo.models import (
    autocast_dtype,
    build_tiny_model,
    build_tiny_tokenizer,
    gradient_checkpointing_is_on,
    make_reference_model,
    native_bf16,
    set_gradient_checkpointing,
)


def fake_gpu(monkeypatch, capability: tuple[int, int], has_emulation_argument: bool = True):
    """A CUDA GPU of this compute capability whose is_bf16_supported() counts emulation, as torch's does."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)

    def is_bf16_supported(including_emulation: bool = True):
        return True if including_emulation else capability >= (8, 0)

    def old_is_bf16_supported():  # torch < 2.3: no argument
        return True

    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", is_bf16_supported if has_emulation_argument else old_is_bf16_supported
    )


@pytest.mark.parametrize("has_emulation_argument", [True, False])
@pytest.mark.parametrize(
    "capability, gpu, expected",
    [
        ((7, 0), "V100", False),
        ((7, 5), "T4", False),
        ((8, 0), "A100", True),
        ((8, 9), "L4", True),
        ((9, 0), "H100", True),
    ],
)
def test_bf16_only_where_native(monkeypatch, capability, gpu, expected, has_emulation_argument):
    fake_gpu(monkeypatch, capability, has_emulation_argument)
    assert native_bf16(torch.device("cuda")) is expected, gpu
    assert autocast_dtype(torch.device("cuda")) == (torch.bfloat16 if expected else None), gpu


def test_cpu_is_fp32_even_with_a_gpu_present(monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    assert not native_bf16("cpu")
    assert autocast_dtype(torch.device("cpu")) is None


def test_t4_reference_model_stays_fp32(monkeypatch):
    model = build_tiny_model(build_tiny_tokenizer())
    fake_gpu(monkeypatch, (7, 5))
    monkeypatch.setattr(models, "autocast_dtype", lambda device, bf16=None: autocast_dtype(torch.device("cuda"), bf16))
    assert next(make_reference_model(model).parameters()).dtype == torch.float32
    fake_gpu(monkeypatch, (8, 0))
    reference = make_reference_model(model)
    assert next(reference.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the policy is untouched
    assert not any(p.requires_grad for p in reference.parameters())


def test_gradient_checkpointing_same_gradients_and_off_for_the_reference():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer).train()
    ids = torch.randint(4, len(tokenizer), (2, 12))

    def gradient():
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    plain = gradient()
    set_gradient_checkpointing(model, True)
    assert gradient_checkpointing_is_on(model)
    assert not gradient_checkpointing_is_on(make_reference_model(model))  # it never runs a backward pass
    torch.testing.assert_close(gradient(), plain, rtol=1e-5, atol=1e-6)
    set_gradient_checkpointing(model, False)
    assert not gradient_checkpointing_is_on(model)


def test_asking_whether_a_plain_model_has_adapters_imports_no_peft():
    """make_reference_model asks it of every policy. Importing peft to answer would import bitsandbytes where it is
    installed: seconds, and on CPUs with AVX-512 BF16 a Hub kernel probe that writes to a lesson's stderr."""
    code = """
import sys
from minigrpo import load_model_and_tokenizer
from minigrpo.models import is_peft_model, make_reference_model
model, _ = load_model_and_tokenizer("tiny", device="cpu")
make_reference_model(model)
assert not is_peft_model(model)
print(sorted({"peft", "bitsandbytes"} & set(sys.modules)))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bitsandbytes_cpu_kernel_probe_lines_are_dropped_and_nothing_else(caplog):
    """The lines bitsandbytes and the kernels package log when a CPU kernel cannot be had (each as logged there),
    beside other lines of the same loggers, which still get through."""
    bitsandbytes_cpu = logging.getLogger("bitsandbytes.backends.cpu.ops")
    kernels_hub = logging.getLogger("kernels._internals.hf_hub")
    with caplog.at_level(logging.WARNING):
        bitsandbytes_cpu.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip "
            "install kernels` and the kernels >= 0.11.1",
            "Kernel repository could not verify publisher trust status",
        )
        kernels_hub.warning(
            "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face "
            "Hub is in offline mode."
        )
        kernels_hub.warning("Skipping publisher trust check for 'someone/their-kernel' because Hugging Face Hub is "
                            "in offline mode.")  # fmt: skip
        bitsandbytes_cpu.warning("some other warning")
    assert [record.getMessage() for record in caplog.records] == [
        "Skipping publisher trust check for 'someone/their-kernel' because Hugging Face Hub is in offline mode.",
        "some other warning",
    ]
