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

A completion has several tokens, and GRPO adds the KL term per token: the table then holds position by
position, each position's KL with its prefix held fixed. The KL of whole completions has one more term (an
early token changes the prefixes, and so the KL, of the later positions), which k1 in the *reward*, summed
to the end of the completion, keeps. `sequence_kl_gradients` shows both, exactly, on two-token completions.
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


# --- completions of several tokens: a per-token KL loss holds each prefix fixed ------------------
def _two_token_logps(logits: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(V + V*V,) logits -> log pi(x1) (V,) and log pi(x2 | x1) (V, V), row x1."""
    if logits.shape != (V + V * V,):
        raise ValueError(f"logits {tuple(logits.shape)}: give (V + V*V,) = ({V + V * V},) for V={V}.")
    return torch.log_softmax(logits[:V], dim=0), torch.log_softmax(logits[V:].view(V, V), dim=1)


def sequence_kl_gradients(logits: torch.Tensor, ref_logits: torch.Tensor, V: int) -> dict[str, torch.Tensor]:
    """Two-token completions o = (x1, x2) over V tokens: what a per-token KL loss follows, exactly.

    logits, ref_logits: (V + V*V,), the first token's V logits, then row x1 of the second token's (V, V)
    logits given x1 (pi_theta and pi_ref). Every entry of the result is a gradient w.r.t. `logits`, (V + V*V,):

    - "sequence": grad KL(pi_theta(o) || pi_ref(o)), the reverse KL of whole completions;
    - "prefix_fixed": sum_t E_{x_<t ~ pi_theta}[grad KL(pi_theta(. | x_<t) || pi_ref(. | x_<t))] with the
      prefixes' probabilities held fixed: each position's reverse KL, as if earlier tokens were given;
    - "k2_per_token": E_{o ~ pi_theta}[grad sum_t k2_t], through the package's `grpo_loss` (beta = 1,
      advantage 0, the per-sequence mean times |o| = 2), what training with kl_estimator="k2" follows;
    - "rho_k3_per_token": the same with k3 and use_bias_correction_kl=True;
    - "k1_reward_to_go": k1 put in the *reward* (PPO-RLHF), each token credited with the k1 of itself and
      every later token (REINFORCE's reward-to-go, gamma = 1): E[sum_t grad log pi(x_t) sum_{t'>=t} k1_t'].

    The sequence KL's gradient is E[sum_t grad log pi(x_t) sum_{t'>=t} k1_t'] (the score of o times its
    log-ratio; earlier tokens' terms vanish): k1 in the reward, summed to the end, follows it exactly. A
    per-token loss keeps only the t' = t term of that sum: it is "prefix_fixed", which misses how an early
    token changes the prefixes, and so the KL, of the positions after it. For one token the two agree.
    """
    logits = logits.detach().double().requires_grad_()
    first, second = _two_token_logps(logits, V)  # (V,), (V, V)
    ref_first, ref_second = (t.detach() for t in _two_token_logps(ref_logits.detach().double(), V))
    seq_logp = first[:, None] + second  # (V, V): log pi(x1, x2)
    ref_seq_logp = ref_first[:, None] + ref_second  # (V, V)
    weight = seq_logp.exp().detach()  # (V, V): how often each completion is sampled
    gradient = lambda objective: torch.autograd.grad(objective, logits, retain_graph=True)[0]  # noqa: E731
    results = {
        "sequence": gradient((seq_logp.exp() * (seq_logp - ref_seq_logp)).sum()),
        "prefix_fixed": gradient(
            (first.exp() * (first - ref_first)).sum()
            + (first.exp().detach() * (second.exp() * (second - ref_second)).sum(1)).sum()
        ),
    }
    for name, estimator in (("k2_per_token", "k2"), ("rho_k3_per_token", "rho_k3")):
        config = _loss_config(estimator)
        expected = 0.0
        for x1 in range(V):
            for x2 in range(V):
                logps = torch.stack([first[x1], second[x1, x2]]).view(1, 2)  # (N, T) = (1, 2)
                ref_logps = torch.stack([ref_first[x1], ref_second[x1, x2]]).view(1, 2)
                loss, _ = grpo_loss(logps, None, ref_logps, torch.zeros(1), torch.ones(1, 2), config)
                expected = expected + weight[x1, x2] * 2 * loss  # x |o| = 2: the sum over tokens, not the mean
        results[name] = gradient(expected)
    k1_first, k1_second = (first - ref_first).detach(), (second - ref_second).detach()  # (V,), (V, V): k1 values
    reward_to_go = weight * (first[:, None] * (k1_first[:, None] + k1_second) + second * k1_second)  # (V, V)
    results["k1_reward_to_go"] = gradient(reward_to_go.sum())
    return results
