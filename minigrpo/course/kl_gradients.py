"""The KL estimators as *losses*: which KL's gradient each one follows, computed exactly on a small distribution.

GRPO's KL term is a per-token estimate evaluated at the sampled token x ~ pi_theta, with
r = pi_ref(x) / pi_theta(x). The sample is data: autograd differentiates only log pi_theta(x),
never the probability of having drawn x. With grad log pi_theta(x) written g(x):

    loss        value                 gradient of the loss       E_{x ~ pi_theta}[gradient]
    k1          -log r                g(x)                       0 (the score function has mean 0)
    k2          (log r)^2 / 2         -log r * g(x)              grad KL(pi_theta || pi_ref)   reverse
    k3          r - log r - 1         (1 - r) * g(x)             grad KL(pi_ref || pi_theta)   forward
    rho_k3      rho * k3, rho = 1     -log r * g(x)              grad KL(pi_theta || pi_ref)   reverse

rho = pi_theta(x) / pi_old(x) with pi_old = pi_theta detached (num_iterations = 1): 1 in value, but
grad rho = g(x), so grad(rho k3) = (1 - r) g + k3 g = -log r * g. That is TRL's `use_bias_correction_kl`
(DeepSeek-V3.2, arXiv 2512.02556), `GRPOConfig.use_bias_correction_kl` here. k1 and k3 are unbiased
estimates of the *value* KL(pi_theta || pi_ref) (Schulman, "Approximating KL Divergence", 2020); as losses
k1 gives no expected gradient at all and k3 the forward KL's.

For a categorical pi_theta = softmax(logits) over V outcomes, g(x) = onehot(x) - pi_theta (w.r.t. the
logits), and the four expectations above hold exactly. `expected_kl_loss_gradient` computes them through
the package's own `grpo_loss` (one sampled token at a time, beta = 1, advantage 0) and autograd;
`exact_kl_gradients` differentiates the two exact KLs. Nothing here samples.
"""

from __future__ import annotations

import torch

from minigrpo.config import GRPOConfig
from minigrpo.losses import grpo_loss

KL_LOSSES: dict[str, tuple[str, bool]] = {
    "k1": ("k1", False),
    "k2": ("k2", False),
    "k3": ("k3", False),
    "rho_k3": ("k3", True),
}
"""Each KL loss as (GRPOConfig.kl_estimator, GRPOConfig.use_bias_correction_kl)."""

KL_DIRECTIONS: dict[str, str] = {"k1": "none", "k2": "reverse", "k3": "forward", "rho_k3": "reverse"}
"""Whose gradient each KL loss follows in expectation: reverse KL(pi_theta || pi_ref), forward
KL(pi_ref || pi_theta), or none (expected gradient 0)."""


def _check_logits(logits: torch.Tensor, ref_logits: torch.Tensor) -> None:
    if logits.dim() != 1 or logits.shape != ref_logits.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} must both be (V,): "
            "one categorical distribution each."
        )


def _loss_config(estimator: str) -> GRPOConfig:
    if estimator not in KL_LOSSES:
        raise ValueError(f"estimator={estimator!r}: use one of {sorted(KL_LOSSES)}.")
    kl_estimator, bias_correction = KL_LOSSES[estimator]
    # the paper's loss (per-sequence mean, k3 as written) with the estimator and correction under study
    return GRPOConfig.deepseekmath(
        beta=1.0, kl_estimator=kl_estimator, use_bias_correction_kl=bias_correction, max_steps=1
    )


def per_sample_kl_losses(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """The KL loss GRPO computes when the sampled token is x, for every x. (V,), (V,) -> (V,).

    Each entry is `grpo_loss` of a one-token completion x with advantage 0 and beta = 1, so only the KL
    term is left; it is differentiable w.r.t. `logits` (pi_theta = softmax(logits); pi_ref =
    softmax(ref_logits), fixed) exactly as in training: pi_old = pi_theta detached.
    """
    _check_logits(logits, ref_logits)
    config = _loss_config(estimator)
    logps = torch.log_softmax(logits, dim=0)  # (V,)
    ref_logps = torch.log_softmax(ref_logits, dim=0).detach()  # (V,)
    one_token = torch.ones(1, 1)  # completion_mask of a single token
    losses = [
        grpo_loss(logps[x].view(1, 1), None, ref_logps[x].view(1, 1), torch.zeros(1), one_token, config)[0]
        for x in range(logits.shape[0])
    ]
    return torch.stack(losses)  # (V,)


def expected_kl_loss_gradient(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{x ~ pi_theta}[grad_logits loss(x)], exactly: sum_x pi_theta(x) grad loss(x). (V,), (V,) -> (V,).

    The weights pi_theta(x) are detached: the loss of a sampled token never differentiates the
    probability of having sampled it (that would be the gradient of E[loss], a different thing).
    """
    logits = logits.detach().double().requires_grad_()
    ref_logits = ref_logits.detach().double()
    weights = torch.softmax(logits, dim=0).detach()  # (V,): how often each x is sampled
    expected_loss = (weights * per_sample_kl_losses(estimator, logits, ref_logits)).sum()
    (gradient,) = torch.autograd.grad(expected_loss, logits)
    return gradient  # (V,)


def exact_kl_gradients(logits: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients w.r.t. the logits of both exact KLs. (V,), (V,) -> {"reverse": (V,), "forward": (V,)}.

    reverse = grad KL(pi_theta || pi_ref) = pi_theta * (log(pi_theta / pi_ref) - KL)   (what GRPO penalises)
    forward = grad KL(pi_ref || pi_theta) = pi_theta - pi_ref
    """
    _check_logits(logits, ref_logits)
    logits = logits.detach().double().requires_grad_()
    logp = torch.log_softmax(logits, dim=0)  # (V,)
    ref_logp = torch.log_softmax(ref_logits.detach().double(), dim=0)  # (V,)
    divergences = {
        "reverse": (logp.exp() * (logp - ref_logp)).sum(),
        "forward": (ref_logp.exp() * (ref_logp - logp)).sum(),
    }
    return {name: torch.autograd.grad(kl, logits, retain_graph=True)[0] for name, kl in divergences.items()}


def kl_gradient_comparison(logits: torch.Tensor, ref_logits: torch.Tensor) -> dict[str, dict[str, float]]:
    """For each KL loss: the distance of its expected gradient from each exact KL's gradient, relative
    to that gradient's norm (0 = the same vector). -> {estimator: {"reverse": float, "forward": float}}."""
    exact = exact_kl_gradients(logits, ref_logits)
    table = {}
    for estimator in KL_LOSSES:
        gradient = expected_kl_loss_gradient(estimator, logits, ref_logits)
        table[estimator] = {
            direction: float((gradient - target).norm() / target.norm()) for direction, target in exact.items()
        }
    return table
