"""TRL-style GRPO scripts, written the way TRL 1.16's documentation, `trl.rewards` and `trl/scripts/grpo.py` write
them, run with `from minigrpo import ...` and, for the same script, with `from trl import ...`: what they read back
(reward inputs, TrainOutput, callbacks, eval names, saved folders) must be there in both.

Each script is a function of the library module, so the two runs are the same code but for the import."""

import asyncio
import importlib
import json
import re
import shutil

import pytest
import torch
from transformers import TrainerCallback

from minigrpo.models import TINY_MODEL_DIR, load_model_and_tokenizer
from minigrpo.tasks.arithmetic import make_arithmetic_dataset

LIBRARIES = ["minigrpo", "trl"]


def library(name: str):
    if name == "trl":
        pytest.importorskip("trl", reason="trl is in the test extra: pip install -e '.[test]'")
    return importlib.import_module(name)


def small_args(lib, output_dir, **fields):
    """The smallest run both libraries accept: 1 prompt x G=4 per step, 8 new tokens, fp32 on the CPU."""
    values = dict(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4, max_steps=2,
                  max_completion_length=8, learning_rate=1e-5, logging_steps=1, save_strategy="no",
                  bf16=False, report_to="none", seed=0)  # fmt: skip
    values.update(fields)
    return lib.GRPOConfig(**values)


# --- the reward functions of TRL's documentation --------------------------------------------------------
def docs_example_2_reward(completions, **kwargs):
    """TRL docs, Example 2 (conversational): reads completion[0]["content"]."""
    pattern = r"<answer>.*?</answer>"
    return [1.0 if re.search(pattern, completion[0]["content"]) else 0.0 for completion in completions]


def gsm8k_style_correctness(prompts, completions, answer, **kwargs):
    """The widely copied GSM8K recipe's correctness reward: the last user message, the response's text."""
    responses = [completion[0]["content"] for completion in completions]
    assert prompts[0][-1]["role"] == "user"  # prompts arrive as message lists
    return [2.0 if answer_ in response else 0.0 for response, answer_ in zip(responses, answer, strict=True)]


async def async_length_reward(completions, **kwargs):
    """TRL docs, Example 5: an async reward (an LLM judge would await a request here)."""
    await asyncio.sleep(0)
    return [-len(completion[0]["content"]) / 100 for completion in completions]


def curriculum_reward(completions, trainer_state, **kwargs):
    """A reward that reads trainer_state (curriculum learning): more weight as training goes on."""
    scale = (trainer_state.global_step + 1) / trainer_state.max_steps
    return [scale] * len(completions)


def logging_reward(completions, log_metric, log_extra, **kwargs):
    """TRL docs, Example 6: log a metric and a column from inside a reward function."""
    lengths = [len(completion[0]["content"]) for completion in completions]
    log_metric("mean_chars", sum(lengths) / len(lengths))
    log_extra("chars", lengths)
    return [0.0] * len(completions)


class StepRecorder(TrainerCallback):
    """transformers' callback protocol: records what it sees; stops the run after `stop_after` steps."""

    def __init__(self, stop_after: int):
        self.events, self.logs, self.stop_after = [], [], stop_after

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("train_begin")

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append(f"step_end:{state.global_step}")
        if state.global_step >= self.stop_after:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append("train_end")


# --- script 1: a conversational dataset, the documented reward patterns, the trainer surface --------
def documented_script(lib, output_dir):
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    dataset = make_arithmetic_dataset(8, "train", seed=1)  # chat prompts, an `answer` column
    recorder = StepRecorder(stop_after=2)
    trainer = lib.GRPOTrainer(
        model=model,
        reward_funcs=[
            docs_example_2_reward,
            gsm8k_style_correctness,
            async_length_reward,
            curriculum_reward,
            logging_reward,
        ],  # fmt: skip
        args=small_args(lib, output_dir, max_steps=3),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    train_result = trainer.train()  # open-r1's lines
    metrics = train_result.metrics
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.save_model()  # no path: output_dir, as in TRL
    return trainer, train_result, recorder


@pytest.mark.parametrize("name", LIBRARIES)
def test_the_documented_script_runs(name, tmp_path):
    trainer, result, recorder = documented_script(library(name), tmp_path)
    # the callback stopped the run after 2 of max_steps=3 steps
    assert result.global_step == trainer.state.global_step == 2
    assert recorder.events[0] == "train_begin" and recorder.events[-1] == "train_end"
    assert "step_end:2" in recorder.events and "step_end:3" not in recorder.events
    assert math_isfinite(result.training_loss) and {"train_runtime", "train_loss"} <= result.metrics.keys()
    assert trainer.state.epoch > 0
    logged = [row for row in trainer.state.log_history if "reward" in row]
    assert len(logged) == 2 and recorder.logs
    for row in logged:
        assert row["num_tokens"] > 0
        assert "mean_chars" in row  # log_metric, averaged over the step
        assert "rewards/curriculum_reward/mean" in row and "rewards/async_length_reward/mean" in row
    assert logged[1]["num_tokens"] > logged[0]["num_tokens"]
    assert logged[0]["rewards/curriculum_reward/mean"] == pytest.approx(1 / 3)  # trainer_state: step 0 of 3
    assert json.loads((tmp_path / "train_results.json").read_text())["train_loss"] == pytest.approx(
        result.training_loss
    )
    assert json.loads((tmp_path / "trainer_state.json").read_text())["global_step"] == 2
    reloaded, _ = load_model_and_tokenizer(str(tmp_path), device="cpu")  # save_model() wrote output_dir
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in trainer.model.parameters())


def math_isfinite(value) -> bool:
    return value == value and abs(value) != float("inf")


@pytest.mark.parametrize("name", LIBRARIES)
def test_evaluation_uses_trls_names_and_needs_a_dataset(name, tmp_path):
    lib = library(name)
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    train, held_out = make_arithmetic_dataset(8, "train", seed=1), make_arithmetic_dataset(8, "test", seed=0)
    args = small_args(lib, tmp_path, max_steps=1)
    trainer = lib.GRPOTrainer(model=model, reward_funcs=[docs_example_2_reward], args=args, train_dataset=train,
                              processing_class=tokenizer)  # fmt: skip
    with pytest.raises((ValueError, TypeError)):  # TRL: "Trainer: evaluation requires an eval_dataset."
        trainer.evaluate()
    metrics = trainer.evaluate(held_out)
    assert {"eval_reward", "eval_rewards/docs_example_2_reward/mean"} <= metrics.keys()


@pytest.mark.parametrize("name", LIBRARIES)
def test_eval_loss_with_num_generations_eval_as_trl_reports_it(name, tmp_path):
    """num_generations_eval samples a group per held-out prompt; the loss at ratio 1 under loss_type 'grpo' and
    beta 0 is the advantages' mean, 0 in each group (at temperature 2 the lengths, so the rewards, differ)."""
    lib = library(name)
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    args = small_args(lib, tmp_path, max_steps=1, num_generations_eval=4, loss_type="grpo", beta=0.0,
                      temperature=2.0, max_completion_length=16)  # fmt: skip
    train, held_out = make_arithmetic_dataset(8, "train", seed=1), make_arithmetic_dataset(2, "test", seed=0)
    trainer = lib.GRPOTrainer(model=model, reward_funcs=[async_length_reward], args=args, train_dataset=train,
                              eval_dataset=held_out, processing_class=tokenizer)  # fmt: skip
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(0.0, abs=1e-6)


def test_evaluate_without_a_dataset_says_what_to_pass(tmp_path):
    from minigrpo import GRPOConfig, GRPOTrainer

    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    trainer = GRPOTrainer(model, [docs_example_2_reward], small_args(importlib.import_module("minigrpo"), tmp_path),
                          make_arithmetic_dataset(8, "train", seed=1), processing_class=tokenizer)  # fmt: skip
    assert isinstance(trainer.args, GRPOConfig)
    with pytest.raises(ValueError, match="pass eval_dataset="):
        trainer.evaluate()


# --- script 1b: an agent with a tool (TRL's tools=, a multi-turn episode per completion) ---------------------
def final_answer_reward(completions, answer, **kwargs):
    """An agent's reward as TRL's documentation writes it: the conversation's last message holds the answer."""
    return [float(f"<answer>{a}</answer>" in c[-1]["content"]) for c, a in zip(completions, answer, strict=True)]


def tool_script(lib, output_dir, conversations: list):
    from minigrpo.tasks.calculator import calculator, make_calculator_dataset

    def recorded_reward(completions, **kwargs):
        conversations.extend(completions)
        return final_answer_reward(completions, **kwargs)

    model, tokenizer = load_model_and_tokenizer("tiny-tools", device="cpu")
    trainer = lib.GRPOTrainer(
        model=model,
        reward_funcs=[recorded_reward],
        args=small_args(
            lib,
            output_dir,
            per_device_train_batch_size=8,
            num_generations=8,
            max_completion_length=192,
            max_tool_calling_iterations=2,
        ),  # fmt: skip
        train_dataset=make_calculator_dataset(16, "train", seed=1),
        processing_class=tokenizer,
        tools=[calculator],
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("name", LIBRARIES)
def test_an_agent_script_with_a_calculator_tool_runs_and_trains(name, tmp_path):
    """The same script on both: the tools model calls its calculator in some episodes, whose conversations reach the
    reward as [assistant with tool_calls, tool, assistant], and the tool metrics are logged under TRL's names."""
    from minigrpo.tool_calling import reads_tool_calls

    if not reads_tool_calls(load_model_and_tokenizer("tiny-tools", device="cpu")[1]):
        pytest.skip("transformers < 5.13: tools= is refused there")
    conversations = []
    trainer = tool_script(library(name), tmp_path, conversations)
    assert trainer.state.global_step == 2 and len(conversations) == 16
    episodes = [c for c in conversations if len(c) > 1]
    assert episodes, "no episode called the calculator"
    assert all([m["role"] for m in c[:2]] == ["assistant", "tool"] and c[0]["tool_calls"] for c in episodes)
    assert all(c[1]["name"] == "calculator" for c in episodes)
    logged = [row for row in trainer.state.log_history if "reward" in row]
    assert all({"tools/call_frequency", "tools/failure_frequency"} <= row.keys() for row in logged)
    assert sum(row["tools/call_frequency"] for row in logged) > 0


# --- script 2: a reward model, by path and loaded ---------------------------------------------------
@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    """A small randomly initialised Qwen2 sequence-classification model, saved with the tiny tokenizer (offline)."""
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForSequenceClassification

    config = AutoConfig.from_pretrained(TINY_MODEL_DIR)
    config.num_labels = 1
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    folder = tmp_path_factory.mktemp("reward_model")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY_MODEL_DIR).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", LIBRARIES)
def test_a_reward_model_by_path_and_loaded(name, tmp_path, reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    lib = library(name)
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    copy_dir = shutil.copytree(reward_model_dir, tmp_path / "same_reward_model")  # same weights, another name
    loaded = AutoModelForSequenceClassification.from_pretrained(copy_dir, num_labels=1)
    trainer = lib.GRPOTrainer(
        model=model,
        reward_funcs=[str(reward_model_dir), loaded],
        args=small_args(lib, tmp_path / "run", max_steps=1),
        train_dataset=make_arithmetic_dataset(4, "train", seed=1),
        processing_class=tokenizer,
        reward_processing_classes=[None, AutoTokenizer.from_pretrained(copy_dir)],
    )
    trainer.train()
    row = next(row for row in trainer.state.log_history if "reward" in row)  # TRL adds a summary row at the end
    by_path, by_object = row[f"rewards/{reward_model_dir.name}/mean"], row["rewards/same_reward_model/mean"]
    assert math_isfinite(by_path) and by_path == pytest.approx(by_object, abs=1e-6)  # same weights, same scores


def test_a_reward_model_scores_as_trl_scores_it(reward_model_dir):
    """logits[:, 0] at the last real token of the chat-templated prompt + completion, right-padded."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from minigrpo.rewards import ModelReward

    tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, num_labels=1)
    reward = ModelReward(model, tokenizer)
    prompts = [[{"role": "user", "content": "What is 1 + 1?"}]] * 2
    completions = [[{"role": "assistant", "content": "<answer>2</answer>"}], [{"role": "assistant", "content": "3"}]]
    scores = reward(prompts=prompts, completions=completions)
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        ids = tokenizer(tokenizer.apply_chat_template(prompt + completion, tokenize=False), return_tensors="pt",
                        add_special_tokens=False)  # fmt: skip
        with torch.inference_mode():
            alone = model(**ids).logits[0, 0].item()  # no padding at all
        assert score == pytest.approx(alone, abs=1e-5)


# --- script 3: TRL's own command-line script -------------------------------------------------------------
@pytest.mark.parametrize("name", LIBRARIES)
def test_trls_cli_script_parses_and_trains(name, tmp_path):
    lib = library(name)
    trl = pytest.importorskip("trl")
    parser = trl.TrlParser((trl.ScriptArguments, lib.GRPOConfig, trl.ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config(
        [
            "--dataset_name",
            "arithmetic",
            "--output_dir",
            str(tmp_path),
            "--report_to",
            "none",
            "--use_vllm",
            "false",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "4",
            "--num_generations",
            "4",
            "--max_completion_length",
            "8",
            "--bf16",
            "false",
            "--save_strategy",
            "no",
            "--model_init_kwargs",
            '{"dtype": "float32"}',
        ]  # fmt: skip
    )
    # trl/scripts/grpo.py's lines
    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs
    trainer = lib.GRPOTrainer(
        model=str(TINY_MODEL_DIR),
        reward_funcs=[docs_example_2_reward],
        args=training_args,
        train_dataset=make_arithmetic_dataset(4, "train", seed=1),
        eval_dataset=None,
        quantization_config=trl.get_quantization_config(model_args),
        peft_config=trl.get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    assert trainer.state.global_step == 1 and (tmp_path / "config.json").exists()


def test_trl_fields_minigrpo_refuses_still_parse_and_then_say_why():
    from transformers import HfArgumentParser

    from minigrpo import GRPOConfig

    (config,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(["--use_vllm", "false", "--report_to", "none"])
    assert config.use_vllm is False and config.report_to == "none"
    with pytest.raises(ValueError, match="use_vllm=True: minigrpo generates with model.generate"):
        HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(["--use_vllm", "true"])
    with pytest.raises(ValueError, match="never runs code shipped in a model folder"):
        GRPOConfig(trust_remote_code=True)
    with pytest.raises(ValueError, match="builds its AdamW"):
        from minigrpo import GRPOTrainer

        GRPOTrainer("tiny", [docs_example_2_reward], GRPOConfig(), make_arithmetic_dataset(4, "train"),
                    optimizers=(object(), None))  # fmt: skip


# --- script 4: prompts longer than any fixed limit ---------------------------------------------------------
@pytest.mark.parametrize("name", LIBRARIES)
def test_a_long_prompt_trains_with_the_default_config(name, tmp_path):
    from datasets import Dataset

    lib = library(name)
    model, tokenizer = load_model_and_tokenizer("tiny", device="cpu")
    question = "Add these numbers carefully. " * 11 + "What is 2 + 2?"  # about 340 tokens of the tiny vocabulary
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": question}]] * 2, "answer": ["4", "4"]})
    text = tokenizer.apply_chat_template(dataset[0]["prompt"], tokenize=False, add_generation_prompt=True)
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) > 256  # longer than the old fixed limit
    trainer = lib.GRPOTrainer(model=model, reward_funcs=[gsm8k_style_correctness],
                              args=small_args(lib, tmp_path, max_steps=1), train_dataset=dataset,
                              processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1


def test_minigrpos_own_rewards_take_both_forms():
    from minigrpo.tasks.arithmetic import correctness_reward, format_reward

    text = "<answer>4</answer>"
    chat = [{"role": "assistant", "content": text}]
    assert correctness_reward(None, [text, chat], answer=["4", "4"]) == [1.0, 1.0]
    assert format_reward(None, [text, chat]) == [1.0, 1.0]
