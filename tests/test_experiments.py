"""minigrpo.course.experiments: lessons 06-07's lab bench (summaries, tables, short runs, a reproducible disconnect)."""

import pytest
import torch

from minigrpo import GRPOTrainer, correctness_reward
from minigrpo.course.experiments import completion_table, simulate_disconnect, summarize_run, train_short_run


def test_simulate_disconnect_raises_on_the_chosen_call_only():
    reward = simulate_disconnect(correctness_reward, on_call=2)
    assert reward.__name__ == "correctness_reward"
    assert reward(None, ["<answer>3</answer>"], answer=["3"]) == [1.0]
    with pytest.raises(KeyboardInterrupt, match="call 2"):
        reward(None, ["<answer>3</answer>"], answer=["3"])
    assert reward(None, ["<answer>4</answer>"], answer=["3"]) == [0.0]
    with pytest.raises(ValueError):
        simulate_disconnect(correctness_reward, on_call=0)


def test_summarize_run_averages_the_last_steps():
    history = [{"step": s, "reward": float(s)} for s in range(1, 7)]
    history[2]["eval_accuracy"] = 0.25
    history[5]["eval_accuracy"] = 0.5
    summary = summarize_run(history, last=3)
    assert summary == {"reward": 5.0, "eval_accuracy": 0.5}
    with pytest.raises(ValueError):
        summarize_run([])


def test_completion_table_marks_right_answers():
    table = completion_table(["1 + 1", "2 + 2"], ["2", "4"], ["<answer>2</answer>", "5"], ["<answer>2</answer>", "4"])
    assert list(table.columns) == ["question", "answer", "before", "ok before", "after", "ok after"]
    assert table["ok before"].tolist() == [True, False]
    assert table["ok after"].tolist() == [True, True]


def test_train_short_run_with_dynamic_sampling_learns(train_dataset, eval_dataset, small_config):
    config = small_config.replace(per_device_train_batch_size=16, beta=0.0, max_steps=2, save_steps=0, eval_steps=2)
    trainer = train_short_run(
        config, [correctness_reward], train_dataset=train_dataset, eval_dataset=eval_dataset, dynamic_sampling=True
    )
    assert trainer.config.dynamic_sampling
    assert [m["step"] for m in trainer.history] == [1, 2]
    assert all(0.0 <= m["dynamic_sampling/kept_fraction"] <= 1.0 for m in trainer.history)
    assert 0.0 <= trainer.history[-1]["eval_accuracy"] <= 1.0


def test_interrupted_run_resumes_to_the_same_weights(tiny, train_dataset, small_config):
    """The lesson-06 demo: a disconnect in step 3, a fresh process resumes, the weights match an uninterrupted run."""
    model, tokenizer = tiny
    config = small_config.replace(max_steps=4, save_steps=0)
    GRPOTrainer(
        model, [correctness_reward], args=config, train_dataset=train_dataset, processing_class=tokenizer
    ).train()
    reference = [p.detach().clone() for p in model.parameters()]

    from minigrpo import load_model_and_tokenizer

    broken, tok = load_model_and_tokenizer("tiny", device="cpu")
    interrupted = config.replace(output_dir=config.output_dir + "-interrupted")
    trainer = GRPOTrainer(
        broken,
        [simulate_disconnect(correctness_reward, 3)],
        args=interrupted,
        train_dataset=train_dataset,
        processing_class=tok,
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.step == 2
    fresh, tok = load_model_and_tokenizer("tiny", device="cpu")
    resumed = GRPOTrainer(
        fresh, [correctness_reward], args=interrupted, train_dataset=train_dataset, processing_class=tok
    )
    resumed.train(resume_from_checkpoint=True)
    history = resumed.state.log_history
    assert [m["step"] for m in history] == [1, 2, 3, 4]
    assert all(torch.equal(a, b) for a, b in zip(reference, fresh.parameters(), strict=True))
