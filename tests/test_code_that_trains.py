"""The code a learner reads is the code that trains: one log-prob kernel, the loop in one place, no private state.

These read the package's source (ast) or run one real training step with a spy: each fails when a second kernel,
a write into a scheduler's private attributes, or TRL's Trainer surface creeps back into the algorithm's files.
"""

import ast
import inspect
import re
from pathlib import Path

import minigrpo
from minigrpo import GRPOTrainer, logprobs
from minigrpo.tasks.arithmetic import correctness_reward

PACKAGE = Path(minigrpo.__file__).parent
REPOSITORY = PACKAGE.parent


def calls_in(function: ast.FunctionDef) -> set[str]:
    """The names of the functions `function` calls (`torch.logsumexp(x)` -> "logsumexp")."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            callee = node.func
            names.add(callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", ""))
    return names


def test_exactly_one_function_in_logprobs_computes_a_log_softmax():
    tree = ast.parse((PACKAGE / "logprobs.py").read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
    normalisers = [f.name for f in functions if calls_in(f) & {"log_softmax", "logsumexp"}]
    assert normalisers == ["selective_log_softmax"]


def test_sampling_time_scoring_and_the_update_both_call_the_one_kernel(tiny, train_dataset, small_config, monkeypatch):
    """One training step with beta > 0 (pi_ref scored at sampling time) and two optimizer steps per generation
    (pi_old scored at sampling time too): the spy sees the kernel called under both, and by the update; the entropy
    only where it is used, the update's metrics (sampling-time scoring throws it away)."""
    callers = []
    kernel = logprobs.selective_log_softmax

    def spy(*args, **kwargs):
        stack = {frame.function for frame in inspect.stack()}
        with_entropy = kwargs.get("with_entropy", args[2] if len(args) > 2 else False)
        callers.append((frozenset({"sample_group_rollout", "grpo_step"} & stack), with_entropy))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(logprobs, "selective_log_softmax", spy)
    model, tokenizer = tiny
    config = small_config.replace(max_steps=2, beta=0.04, num_iterations=2, save_steps=0)
    trainer = GRPOTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer)
    trainer.train()
    assert trainer.step == 2
    assert {"sample_group_rollout"} in [caller for caller, _ in callers]  # pi_old and pi_ref, without gradients
    assert {"grpo_step"} in [caller for caller, _ in callers]  # the update's forward pass (and its recomputation)
    assert all(caller for caller, _ in callers), "every log-prob of the step came through scoring or the update"
    assert {with_entropy for caller, with_entropy in callers if caller == {"sample_group_rollout"}} == {False}
    assert {with_entropy for caller, with_entropy in callers if caller == {"grpo_step"}} == {True}


def test_the_printed_update_is_short_and_reaches_the_kernel_in_five_calls(
    tiny, train_dataset, small_config, monkeypatch
):
    """Lesson 04b prints GRPOTrainer.update and grpo_step: together at most 50 lines, as the single file's
    grpo_update. From update to the log-prob kernel, at most 5 of minigrpo's calls (torch's own do not count), in one
    process with the shared prompt prefix on: update -> grpo_step -> policy_logps -> completion_logps ->
    project_to_logps -> selective_log_softmax."""
    lines = len(inspect.getsource(GRPOTrainer.update).splitlines()) + len(
        inspect.getsource(GRPOTrainer.grpo_step).splitlines()
    )
    assert lines <= 50, f"update + grpo_step: {lines} lines"

    depths = []
    kernel = logprobs.selective_log_softmax

    def spy(*args, **kwargs):
        frames = [frame for frame in inspect.stack() if frame.filename.startswith(str(PACKAGE))]  # innermost first
        names = [frame.function for frame in frames]
        if "update" in names:
            depths.append(names.index("update") + 1)  # minigrpo's frames below update, the kernel's own included
        return kernel(*args, **kwargs)

    monkeypatch.setattr(logprobs, "selective_log_softmax", spy)
    model, tokenizer = tiny
    config = small_config.replace(max_steps=1, save_steps=0)
    assert config.share_prompt_prefix and config.per_device_train_batch_size % config.num_generations == 0
    GRPOTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer).train()
    assert depths and max(depths) <= 5, depths


def test_no_code_writes_a_schedulers_private_attributes():
    """The learning rate is run.schedule.lr_at(step): a resume restores the step, never a scheduler's state."""
    private_write = re.compile(r"\b\w*sched\w*\._\w+\s*=[^=]")
    offenders = [
        f"{path.relative_to(REPOSITORY)}:{number}"
        for folder in ("minigrpo", "bench", "scripts", "examples")
        for path in sorted((REPOSITORY / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if private_write.search(line)
    ]
    assert offenders == []
    assert private_write.search("self.scheduler._last_lr = [0.1]")  # the pattern does catch such a write


def test_trainer_py_holds_the_loop_and_the_update_not_trls_surface():
    tree = ast.parse((PACKAGE / "trainer.py").read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    assert not defined & {"TrainerState", "log_metrics", "save_metrics", "save_state", "add_callback"}
    constructed = {
        node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "CallbackHandler" not in constructed and "TrainerState" not in constructed
    # ... and the trainer still offers them, from run.trl_api
    assert all(hasattr(GRPOTrainer, name) for name in ("log_metrics", "save_metrics", "save_state", "add_callback"))


def test_one_save_checkpoint():
    definitions = [
        f"{path.relative_to(REPOSITORY)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name == "save_checkpoint"
    ]
    assert definitions == ["minigrpo/run/resume.py"]
