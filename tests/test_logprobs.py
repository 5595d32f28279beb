"""Per-token log-probs (the logits/labels shift, chunking, padding) and masked reductions."""

import pytest
import torch
import torch.nn.functional as F

from minigrpo.logprobs import (
    batched_per_token_logps,
    entropy_from_logits,
    masked_mean,
    masked_sum,
    per_token_logps,
    selective_log_softmax,
)


def naive_logps(model, input_ids, T):
    """The textbook version: full log_softmax over the vocabulary, then gather. (n, T)"""
    logits = model(input_ids=input_ids).logits[:, -T - 1 : -1]  # position t-1 predicts token t
    return F.log_softmax(logits.float(), -1).gather(-1, input_ids[:, -T:].unsqueeze(-1)).squeeze(-1)


def test_selective_log_softmax_matches_log_softmax():
    logits = torch.randn(7, 11)
    index = torch.randint(0, 11, (7,))
    expected = F.log_softmax(logits, -1)[torch.arange(7), index]
    torch.testing.assert_close(selective_log_softmax(logits, index), expected)


def test_entropy_by_hand():
    uniform = torch.zeros(1, 4)
    assert entropy_from_logits(uniform).item() == pytest.approx(torch.log(torch.tensor(4.0)).item())
    certain = torch.tensor([[100.0, 0.0, 0.0]])
    assert entropy_from_logits(certain).item() == pytest.approx(0.0, abs=1e-6)


def test_per_token_logps_match_naive_and_chunking_changes_nothing(tiny):
    model, _ = tiny
    input_ids = torch.randint(4, 80, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(input_ids)
    expected = naive_logps(model, input_ids, T=5)
    for chunk_size in (1, 4, 4096):
        logps, entropy = per_token_logps(model, input_ids, mask, 5, chunk_size=chunk_size)
        torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)
        assert entropy.shape == (3, 5) and (entropy > 0).all()


def test_off_by_one_shift_would_be_caught(tiny):
    """Using the logits *at* each token (not before it) gives different numbers: the classic bug."""
    model, _ = tiny
    input_ids = torch.randint(4, 80, (2, 10), generator=torch.Generator().manual_seed(1))
    logps, _ = per_token_logps(model, input_ids, torch.ones_like(input_ids), 4)
    logits = model(input_ids=input_ids).logits[:, -4:]  # wrong: no shift
    shifted_wrong = F.log_softmax(logits, -1).gather(-1, input_ids[:, -4:].unsqueeze(-1)).squeeze(-1)
    assert (logps - shifted_wrong).abs().max() > 0.1


def test_left_padding_of_prompts_changes_nothing(tiny):
    model, _ = tiny
    prompt = torch.tensor([[5, 6, 7, 8]])
    completion = torch.tensor([[9, 10, 11]])
    plain = torch.cat([prompt, completion], 1)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), plain], 1)  # three pad tokens on the left
    padded_mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(plain)], 1)
    a, _ = per_token_logps(model, plain, torch.ones_like(plain), 3)
    b, _ = per_token_logps(model, padded, padded_mask, 3)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_right_padding_of_completions_does_not_touch_earlier_tokens(tiny):
    model, _ = tiny
    ids = torch.tensor([[5, 6, 7, 8, 9, 2, 0, 0]])  # EOS (2) then padding (0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    full, _ = per_token_logps(model, ids, mask, 4)
    short, _ = per_token_logps(model, ids[:, :6], mask[:, :6], 2)
    torch.testing.assert_close(full[:, :2], short, atol=1e-5, rtol=0)


def test_temperature_divides_logits(tiny):
    model, _ = tiny
    ids = torch.randint(4, 80, (2, 8), generator=torch.Generator().manual_seed(2))
    hot, _ = per_token_logps(model, ids, torch.ones_like(ids), 3, temperature=2.0)
    logits = model(input_ids=ids).logits[:, -4:-1] / 2.0
    expected = F.log_softmax(logits, -1).gather(-1, ids[:, -3:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(hot, expected, atol=1e-5, rtol=0)


def test_batched_version_has_no_grad_and_same_values(tiny):
    model, _ = tiny
    ids = torch.randint(4, 80, (5, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    batched = batched_per_token_logps(model, ids, mask, 4, batch_size=2)
    assert not batched.requires_grad
    torch.testing.assert_close(batched, per_token_logps(model, ids, mask, 4)[0].detach(), atol=1e-5, rtol=0)


def test_gradient_reaches_the_model(tiny):
    model, _ = tiny
    ids = torch.randint(4, 80, (2, 8), generator=torch.Generator().manual_seed(4))
    logps, _ = per_token_logps(model, ids, torch.ones_like(ids), 3, chunk_size=2)
    logps.sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0


def test_masked_mean_and_sum_by_hand():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    assert masked_sum(values, mask).item() == 9.0  # NaN and inf under the mask do not leak
    torch.testing.assert_close(masked_mean(values, mask, dim=1), torch.tensor([1.5, 6.0]))
    assert masked_mean(values, mask).item() == pytest.approx(3.0)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0
