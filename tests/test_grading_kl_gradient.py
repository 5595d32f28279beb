"""Exercise 09's checks: each known mistake about the KL losses' gradients gets the hint that names it."""

import pytest
import torch

from minigrpo import grading
from minigrpo.course.kl_gradients import KL_DIRECTIONS, exact_kl_gradients, expected_kl_loss_gradient


def closed_form(estimator, logits, ref_logits, detach_weights=True, centre=True, sign=1.0, ratio_gradient=True):
    """A learner's closed form, E[c(x) (onehot(x) - pi)], with switches that plant the classic mistakes."""
    logp, ref_logp = torch.log_softmax(logits, 0), torch.log_softmax(ref_logits, 0)
    pi, log_r = logp.exp(), ref_logp - logp
    k3_coefficient = 1 - log_r.exp()
    rho_k3 = -log_r if ratio_gradient else k3_coefficient
    coefficient = {"k1": torch.ones_like(log_r), "k2": -log_r, "k3": k3_coefficient, "rho_k3": rho_k3}[estimator]
    weighted = pi * coefficient
    return sign * (weighted - pi * weighted.sum() if centre else weighted)


def differentiates_the_value(estimator, logits, ref_logits):
    """grad of sum_x pi(x) k(x) with the weights *not* detached."""
    logits = logits.detach().requires_grad_()
    logp, ref_logp = torch.log_softmax(logits, 0), torch.log_softmax(ref_logits, 0)
    log_r = ref_logp - logp
    k = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - log_r - 1, "rho_k3": log_r.exp() - log_r - 1}
    (gradient,) = torch.autograd.grad((logp.exp() * k[estimator]).sum(), logits)
    return gradient


def test_a_closed_form_solution_gets_full_marks(capsys):
    result = grading.check_kl_loss_gradient(closed_form)
    assert result.passed and result.points == result.max_points == 5
    directions = grading.check_kl_directions(lambda: dict(KL_DIRECTIONS.items()))
    assert directions.points == 0  # it is the package's own answer key
    answers = {"k1": "none", "k2": "reverse", "k3": "forward", "rho_k3": "reverse"}
    assert grading.check_kl_directions(lambda: answers).points == 2


@pytest.mark.parametrize(
    "learner, phrase",
    [
        (lambda e, z, r: closed_form(e, z, r, sign=-1.0), "sign is flipped"),
        (lambda e, z, r: closed_form(e, z, r, centre=False), "dropped the softmax's - pi"),
        (lambda e, z, r: closed_form(e, z, r, ratio_gradient=False), "that is plain k3's gradient"),
        (differentiates_the_value, "differentiated the expected value"),
        (
            lambda e, z, r: exact_kl_gradients(z, r)["reverse"] if e == "k3" else closed_form(e, z, r),
            "that is the reverse KL's gradient",
        ),
        (lambda e, z, r: closed_form("k3", z, r), "forward KL's gradient (k3's)"),
    ],
    ids=["sign", "no_softmax_term", "ratio_as_constant", "value_gradient", "k3_reverse", "all_k3"],
)
def test_each_planted_mistake_gets_its_hint(learner, phrase):
    result = grading.run_check("check_kl_loss_gradient", learner, quiet=True, allow_reference=True)
    failed = [case for case in result.cases if not case.passed]
    assert failed and result.points < result.max_points
    assert any(phrase in case.message for case in failed), [case.message for case in failed]


def test_directions_check_rejects_wrong_or_malformed_answers():
    swapped = grading.run_check(
        "check_kl_directions", lambda: {**KL_DIRECTIONS, "k1": "reverse"}, quiet=True, allow_reference=True
    )
    assert swapped.points == 1.5 and "k1: not 'reverse'" in swapped.cases[0].message
    malformed = grading.run_check("check_kl_directions", lambda: ["reverse"], quiet=True, allow_reference=True)
    assert malformed.points == 0 and "return a dict" in malformed.cases[0].message
    unknown = grading.run_check(
        "check_kl_directions", lambda: {**KL_DIRECTIONS, "k2": "backward"}, quiet=True, allow_reference=True
    )
    assert "'backward' is not one of" in unknown.cases[1].message


def test_the_reference_earns_zero():
    assert grading.check_kl_loss_gradient(expected_kl_loss_gradient).points == 0
