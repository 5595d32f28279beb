"""Tool-calling episodes (GRPOTrainer(tools=...)): equal to TRL's loop on scripted turns, no gradient on the tools'
tokens, the loop's limits (rounds, budget, a hanging or failing tool), and the refusals that say what to change."""

import importlib.util
import time

import pytest
import torch

import minigrpo.rollout
from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.losses import grpo_loss
from minigrpo.measuring.crosscheck_tools import TOOLS, scripted_dataset, scripted_generate_completions
from minigrpo.rollout import Rollout
from minigrpo.tasks.arithmetic import correctness_reward
from minigrpo.tokenization import TOOLS_CHAT_TEMPLATE, TOOLS_RESPONSE_TEMPLATE, build_tiny_tokenizer
from minigrpo.tool_calling import call_tool, check_tool_support, reads_tool_calls, run_episodes, tools_by_name

needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (the bench extra)")
PARSES_TOOL_CALLS = reads_tool_calls(build_tiny_tokenizer())
needs_parsing = pytest.mark.skipif(not PARSES_TOOL_CALLS, reason="transformers < 5.13: tools= is refused there")


@pytest.fixture
def tools_tiny(tiny):
    """The tiny Qwen with the tools model's chat and response templates."""
    model, tokenizer = tiny
    tokenizer.chat_template, tokenizer.response_template = TOOLS_CHAT_TEMPLATE, TOOLS_RESPONSE_TEMPLATE
    return model, tokenizer


@pytest.fixture
def scripted(tools_tiny, monkeypatch):
    """Generation replaced by the cross-check's script (one row per branch of the loop): the turns are fixed, the
    rest (parsing, tools, masks, loss) is the package's own code."""
    monkeypatch.setattr(minigrpo.rollout, "generate_completions", scripted_generate_completions(tools_tiny[1], 320))
    return tools_tiny


def tools_config(tmp_path, **overrides) -> GRPOConfig:
    options = dict(
        prompts_per_step=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=320,
        max_prompt_length=None,
        max_steps=1,
        shuffle_dataset=False,
        output_dir=str(tmp_path / "run"),
    )
    return GRPOConfig.tiny_cpu(**{**options, **overrides})


def tools_trainer(scripted, tmp_path, **overrides) -> GRPOTrainer:
    model, tokenizer = scripted
    config = tools_config(tmp_path, **overrides)
    dataset = scripted_dataset(4)
    return GRPOTrainer(model, [correctness_reward], config, dataset, dataset, processing_class=tokenizer, tools=TOOLS)


# --- equal to TRL -----------------------------------------------------------------------
@needs_trl
@needs_parsing
def test_episodes_tool_mask_rewards_advantages_and_loss_equal_trls():
    from minigrpo.measuring.crosscheck_tools import crosscheck_tools

    diffs = crosscheck_tools(verbose=True)
    for name in ("completion_ids", "completion_mask", "tool_mask", "conversations"):
        assert diffs[name] == 0, name
    assert diffs["advantages"] <= 1e-6 and diffs["kl"] > 1e-5  # the KL term is really tested
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        assert diffs[loss_type] <= 1e-6 and diffs[f"grad/{loss_type}"] <= 1e-4, (loss_type, diffs)


@needs_parsing
def test_the_script_takes_every_branch_of_the_loop(scripted, tmp_path):
    rollout, _, rewards, _ = tools_trainer(scripted, tmp_path).generate_and_score(2)
    assert rollout.tool_calls.tolist() == [1, 0, 1, 0, 2, 1, 1, 1]  # two rounds in row 4
    assert rollout.tool_failures.tolist() == [0, 0, 1, 0, 1, 0, 0, 0]  # unknown tool; a tool that raised
    assert rollout.is_truncated.tolist() == [False] * 6 + [True, False]  # row 6 ran out of tokens
    tool_tokens = (rollout.completion_mask - rollout.trained_mask).sum(1)
    assert tool_tokens[[1, 3, 7]].tolist() == [0, 0, 0]  # no call, malformed call, result dropped: no tool tokens
    assert (tool_tokens[[0, 2, 4, 5, 6]] > 0).all()
    conversation = rollout.conversations[0]
    assert [m["role"] for m in conversation] == ["assistant", "tool", "assistant"]
    assert conversation[1]["content"] == "84" and conversation[2]["content"] == "<answer>84</answer>"
    assert "not found" in rollout.conversations[2][1]["content"]
    assert rewards.tolist()[:2] == [1.0, 1.0]


# --- the tools' tokens are never trained on ----------------------------------------------------
@needs_parsing
def test_tool_result_tokens_get_exactly_zero_gradient_and_would_without_the_mask(scripted, tmp_path):
    trainer = tools_trainer(scripted, tmp_path, beta=0.04)
    rollout, _, rewards, _ = trainer.generate_and_score(2)
    advantages = torch.linspace(-1.0, 1.0, len(rewards))  # all different: every row carries a signal
    is_tool = (rollout.completion_mask - rollout.trained_mask).bool()  # (N, T): the tools' results
    assert is_tool.sum() > 50
    config = trainer.config

    def gradients(mask, ref):
        trainer.model.zero_grad(set_to_none=True)
        logps = trainer.policy_logps(rollout, slice(None))[0]  # (N, T)
        logps.retain_grad()
        loss, _ = grpo_loss(logps, None, ref, advantages, mask, config, mask.sum())
        loss.backward()
        return logps.grad, [p.grad.clone() for p in trainer.model.parameters()]

    mask = trainer.loss_mask(rollout)
    per_token, weights = gradients(mask, rollout.ref_per_token_logps)
    assert (per_token[is_tool] == 0).all()  # exactly 0 on every tool token
    assert (per_token[mask.bool()] != 0).float().mean() > 0.9  # and not on the model's own
    # perturb what the loss reads on the tool's tokens (pi_ref there): the gradient does not move by a bit
    perturbed = rollout.ref_per_token_logps + 5.0 * is_tool
    assert all(torch.equal(a, b) for a, b in zip(weights, gradients(mask, perturbed)[1], strict=True))
    # unmask them (the classic bug): they get a gradient, and the perturbation now changes the update
    per_token, unmasked = gradients(rollout.completion_mask, rollout.ref_per_token_logps)
    assert (per_token[is_tool] != 0).float().mean() > 0.9
    _, unmasked_perturbed = gradients(rollout.completion_mask, perturbed)
    assert not all(torch.equal(a, b) for a, b in zip(unmasked, unmasked_perturbed, strict=True))


@needs_parsing
def test_rollout_operations_carry_the_tool_mask_row_for_row(scripted, tmp_path):
    rollout = tools_trainer(scripted, tmp_path).generate_and_score(2)[0]
    picked = rollout.select(torch.tensor([6, 0]))
    assert torch.equal(picked.tool_mask, rollout.tool_mask[[6, 0]])
    assert picked.conversations == [rollout.conversations[6], rollout.conversations[0]]
    assert picked.tool_calls.tolist() == [1, 1]
    short = rollout.select(torch.tensor([1]))  # one turn, no tool: T shrinks when joined
    short.completion_ids, short.completion_mask, short.tool_mask = (
        x[:, :20] for x in (short.completion_ids, short.completion_mask, short.tool_mask)
    )
    joined = Rollout.concat([short, picked], pad_token_id=0)
    assert torch.equal(joined.trained_mask[1:], picked.trained_mask)
    assert joined.trained_mask[0].sum() == 20 and joined.tool_mask.shape == joined.completion_mask.shape


@needs_parsing
def test_mask_truncated_completions_drops_the_whole_episode(scripted, tmp_path):
    trainer = tools_trainer(scripted, tmp_path, mask_truncated_completions=True)
    rollout = trainer.generate_and_score(2)[0]
    mask = trainer.loss_mask(rollout)
    assert mask[rollout.is_truncated].sum() == 0 and mask[~rollout.is_truncated].sum() > 0
    assert torch.equal(mask[~rollout.is_truncated], rollout.trained_mask[~rollout.is_truncated])


@needs_parsing
def test_training_with_dynamic_sampling_logs_and_evaluation_reports_the_tools(scripted, tmp_path):
    trainer = tools_trainer(
        scripted, tmp_path, dynamic_sampling=True, log_completions=True, num_completions_to_print=2, eval_steps=1
    )
    trainer.train()
    history = trainer.state.log_history
    assert history[0]["tools/call_frequency"] == pytest.approx(7 / 8)
    assert history[0]["tools/failure_frequency"] == pytest.approx(2 / 7)
    # the model's tokens only, as TRL counts them
    assert history[0]["completions/max_length"] < 320
    evaluation = trainer.evaluate()
    assert evaluation["eval_tools/call_frequency"] == pytest.approx(2 / 4)  # 4 prompts: the script's rows 0-3
    assert (tmp_path / "run" / "completions.jsonl").read_text().count("tool_response") > 0


# --- the loop's limits --------------------------------------------------------------------------
def calculator(expression: str) -> str:
    """Multiply.

    Args:
        expression: "a * b".
    """
    a, b = expression.split("*")
    return str(int(a) * int(b))


def call_ids(tokenizer, expression: str = "2*3") -> list[int]:
    arguments = f'{{"expression": "{expression}"}}'
    text = f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call><|im_end|>'
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@needs_parsing
@pytest.mark.parametrize("rounds", [0, 1, 2, None])
def test_max_tool_calling_iterations_bounds_the_rounds_of_calls(tools_tiny, rounds):
    _, tokenizer = tools_tiny
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[calculator],
                                           add_generation_prompt=True, return_dict=False)  # fmt: skip
    turns = []

    def always_call(contexts, rows, turn):
        turns.append(turn)
        return [call_ids(tokenizer) for _ in contexts]

    config = GRPOConfig(max_completion_length=400, max_tool_calling_iterations=rounds)
    episodes = run_episodes([prompt], [call_ids(tokenizer)], always_call, tokenizer, [calculator], config, 512)
    calls, answers = {0: (0, 0), 1: (1, 1), 2: (2, 2), None: (3, 2)}[rounds]  # None: a 3rd result does not fit
    assert episodes.tool_calls == [calls] and len(turns) == answers
    assert episodes.conversations[0].count({"role": "tool", "name": "calculator", "content": "6"}) == answers
    assert len(episodes.completion_ids[0]) == len(episodes.tool_mask[0]) <= 400


def test_a_tool_that_hangs_or_raises_gives_an_error_result_not_a_crash():
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "done"

    functions = tools_by_name([slow, calculator])
    started = time.perf_counter()
    name, result, failed = call_tool({"type": "function", "function": {"name": "slow", "arguments": {"seconds": 30}}},
                                     functions, timeout=0.5)  # fmt: skip
    assert time.perf_counter() - started < 5 and failed and "more than 0.5 s" in result["error"]
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
    assert call_tool(call, functions, 1.0)[1:] == ({"error": "not enough values to unpack (expected 2, got 1)"}, True)
    assert call_tool({"type": "other", "name": "x"}, functions, 1.0)[2]


# --- refusals that say what to change ---------------------------------------------------------------
def test_tools_that_cannot_run_are_refused_by_name():
    async def fetch(url: str) -> str:
        """Fetch.

        Args:
            url: where.
        """
        return url

    with pytest.raises(TypeError, match="fetch is async"):
        tools_by_name([fetch])
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        tools_by_name([calculator, calculator])
    with pytest.raises(TypeError, match="is not a function"):
        tools_by_name(["calculator"])


@needs_parsing
def test_a_tokenizer_that_cannot_run_episodes_is_refused_with_what_to_do(tiny):
    class BeforeTransformers513:
        def parse_response(self, response, schema=None):  # no prefix=: the schema parser only
            return {}

    with pytest.raises(ImportError, match=r"transformers >= 5.13"):
        check_tool_support(BeforeTransformers513(), [calculator])
    _, tokenizer = tiny
    with pytest.raises(ValueError, match="no response_template"):
        check_tool_support(tokenizer, [calculator])
    tokenizer.response_template = TOOLS_RESPONSE_TEMPLATE  # the plain tiny template drops the calls
    with pytest.raises(ValueError, match="drops tool_name_x, arg_key_x, arg_value_x"):
        check_tool_support(tokenizer, [calculator])
    # a template that writes something after a call only when a tool's result follows: not prefix-preserving
    tokenizer.chat_template = TOOLS_CHAT_TEMPLATE.replace(
        "{{- '<|im_end|>\n' }}{%- elif message.role == 'tool' %}",
        "{%- if not loop.last %}{{- 'x' }}{%- endif %}{{- '<|im_end|>\n' }}{%- elif message.role == 'tool' %}",
    )
    assert tokenizer.chat_template != TOOLS_CHAT_TEMPLATE
    with pytest.raises(ValueError, match="not prefix-preserving"):
        check_tool_support(tokenizer, [calculator])


def test_trl_keywords_minigrpo_does_not_implement_are_refused_by_name(tools_tiny, train_dataset, tmp_path):
    model, tokenizer = tools_tiny
    config = GRPOConfig.tiny_cpu(output_dir=str(tmp_path), max_prompt_length=None)
    for keyword in ("rollout_func", "environment_factory"):
        with pytest.raises(ValueError, match=keyword):
            GRPOTrainer(model, [correctness_reward], config, train_dataset, processing_class=tokenizer,
                        **{keyword: lambda *args: None})  # fmt: skip
    from minigrpo.ppo import PPOConfig, PPOTrainer

    with pytest.raises(NotImplementedError, match="PPOTrainer trains single-turn completions"):
        PPOTrainer(model, [correctness_reward], PPOConfig(output_dir=str(tmp_path), max_prompt_length=None),
                   train_dataset, processing_class=tokenizer, tools=[calculator])  # fmt: skip


@needs_parsing
def test_episode_log_probs_through_the_shared_prompt_prefix_equal_the_plain_path(scripted, tmp_path):
    """share_prompt_prefix runs each group's prompt once: an episode's later turns and the tool's tokens come after
    the shared prompt like any completion, so their log-probs are the plain path's."""
    from minigrpo.rollout import completion_logps

    trainer = tools_trainer(scripted, tmp_path)
    rollout = trainer.generate_and_score(2)[0]
    on = completion_logps(trainer.model, rollout, trainer.config.replace(share_prompt_prefix=True))[0]
    off = completion_logps(trainer.model, rollout, trainer.config.replace(share_prompt_prefix=False))[0]
    mask = rollout.completion_mask.bool()
    assert torch.allclose(on[mask], off[mask], atol=1e-4)
