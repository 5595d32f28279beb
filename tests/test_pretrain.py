"""The supervised warm-up's batch builder (prompt and completion tokenized apart, right-padded, shifted by one)."""

import pytest
import torch

from minigrpo.course.pretrain import arithmetic_sft_batch, build_sft_batch, sft_loss
from minigrpo.models import build_tiny_model, build_tiny_tokenizer


class CharTokenizer:
    """One token per character (its code point), except "bx", which merges into one token, 1000.

    The merge shows why prompt and completion are tokenized apart: "ab" + "xy" tokenized as one text
    would put a token straddling the boundary.
    """

    def __init__(self, pad_token_id: int | None = 0):
        self.pad_token_id = pad_token_id

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids, i = [], 0
        while i < len(text):
            if text[i : i + 2] == "bx":
                ids.append(1000)
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}


def test_batch_by_hand_with_an_empty_completion_and_rows_of_different_lengths():
    a, b, c, d, e, f, g, x, y, z = (ord(ch) for ch in "abcdefgxyz")
    batch = build_sft_batch(["ab", "c", "defg"], ["xy", "", "z"], CharTokenizer(pad_token_id=0))
    # rows (L = 5): a b | x y, then pad; c | (empty); d e f g | z. "bx" stays two tokens: tokenized apart.
    assert batch["input_ids"].tolist() == [[a, b, x, y], [c, 0, 0, 0], [d, e, f, g]]  # all but the last token
    assert batch["labels"].tolist() == [[b, x, y, 0], [0, 0, 0, 0], [e, f, g, z]]  # all but the first
    assert batch["response_mask"].tolist() == [
        [False, True, True, False],  # labels x, y are the completion; the pad is not
        [False, False, False, False],  # an empty completion teaches nothing
        [False, False, False, True],  # the longest prompt: only z
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["response_mask"].dtype == torch.bool and batch["attention_mask"].dtype == torch.long


def test_pad_equal_to_eos_keeps_the_eos_in_the_masks():
    eos = ord("$")  # many tokenizers pad with their EOS: the masks must come from lengths, not ids != pad
    batch = build_sft_batch(["p", "pq"], ["y$", "yz$"], CharTokenizer(pad_token_id=eos))
    # rows (L = 5): p y $ pad pad; p q y z $
    assert batch["input_ids"].tolist() == [[ord("p"), ord("y"), eos, eos], [ord("p"), ord("q"), ord("y"), ord("z")]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]  # the first eos is real, the second pad
    assert batch["response_mask"].tolist() == [[True, True, False, False], [False, True, True, True]]
    assert batch["labels"][1, 3].item() == eos  # the model learns to stop


def test_extra_pad_columns_widen_every_row_with_padding_only():
    plain = build_sft_batch(["ab", "c"], ["xy", "z"], CharTokenizer())
    wider = build_sft_batch(["ab", "c"], ["xy", "z"], CharTokenizer(), extra_pad_columns=1)
    assert wider["input_ids"].shape == (2, 4) and plain["input_ids"].shape == (2, 3)
    for key in ("input_ids", "labels", "response_mask", "attention_mask"):
        assert torch.equal(wider[key][:, :3], plain[key])
    assert wider["labels"][:, 3].tolist() == [0, 0] and not wider["response_mask"][:, 3].any()


def test_bad_input_is_clear():
    with pytest.raises(TypeError, match="lists of strings"):
        build_sft_batch("ab", ["x"], CharTokenizer())
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        build_sft_batch(["a", "b"], ["x"], CharTokenizer())
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        build_sft_batch(["a", ""], ["x", "y"], CharTokenizer())
    with pytest.raises(ValueError, match="extra_pad_columns=-1"):
        build_sft_batch(["a"], ["x"], CharTokenizer(), extra_pad_columns=-1)
    with pytest.raises(ValueError, match="no pad token"):
        build_sft_batch(["a"], ["x"], CharTokenizer(pad_token_id=None))


def test_the_warm_up_batch_and_loss_are_transformers_labels_loss_bit_for_bit():
    """pretrain-tiny reproduces the bundled checkpoint because its model reads the same ids, and its loss is the same
    computation, as transformers' own `labels=` loss (labels -100 off the answer; transformers shifts them itself)."""
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    prompts = [[{"role": "user", "content": "What is 12 + 7?"}], [{"role": "user", "content": "What is 3 + 105?"}]]
    batch = arithmetic_sft_batch(tokenizer, prompts, ["19", "108"])
    assert (batch["labels"][batch["response_mask"]] == tokenizer.pad_token_id).sum() == 0
    assert batch["labels"][batch["response_mask"]][-1].item() == tokenizer.eos_token_id  # the longest row's EOS
    targets = batch["labels"].masked_fill(~batch["response_mask"], -100)  # (n, L - 1)
    labels = torch.cat([torch.full_like(targets[:, :1], -100), targets[:, :-1]], dim=1)  # unshifted, as HF wants
    ours = sft_loss(model, batch)
    theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
    assert torch.equal(ours, theirs)
    ours_grad = torch.autograd.grad(ours, list(model.parameters()))
    theirs_grad = torch.autograd.grad(theirs, list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ours_grad, theirs_grad, strict=True))
