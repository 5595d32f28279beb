"""What TRL scripts reach for beyond the loop: resuming with a larger max_steps, use_cpu, trainer.accelerator,
and a refusal that says what to do for every TRL field minigrpo does not implement."""

import dataclasses
import subprocess
import sys

import pytest

from minigrpo import GRPOConfig, GRPOTrainer
from minigrpo.run.checkpoints import CheckpointError
from minigrpo.run.schedule import lr_at
from minigrpo.tasks.arithmetic import correctness_reward, make_arithmetic_dataset
from minigrpo.trl_compat import instead_of, refused_field_message


def small_config(output_dir, **fields) -> GRPOConfig:
    values = dict(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4, max_steps=2,
                  max_completion_length=8, learning_rate=1e-5, logging_steps=1, save_steps=1, eval_strategy="no",
                  bf16=False, seed=0, lr_scheduler_type="linear")  # fmt: skip
    return GRPOConfig(**{**values, **fields})


def trainer_for(config) -> GRPOTrainer:
    return GRPOTrainer("tiny", [correctness_reward], config, make_arithmetic_dataset(8, "train"))


def test_resuming_with_a_larger_max_steps_continues_with_the_linear_decay_recomputed(tmp_path, capsys):
    trainer_for(small_config(tmp_path)).train()  # steps 1-2 of 2: the rate decays 1e-5 -> 5e-6 (step 0, 1)
    longer = small_config(tmp_path, max_steps=4)
    trainer = trainer_for(longer)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 4
    rates = [row["learning_rate"] for row in trainer.state.log_history]
    # steps 1-2 as the 2-step run had them; steps 3-4 (optimizer steps 2, 3) on the decay to 0 at step 4
    assert rates == pytest.approx([1e-5, 5e-6, 1e-5 * 2 / 4, 1e-5 * 1 / 4])
    assert rates[2] == pytest.approx(lr_at(2, longer, 4))
    said = capsys.readouterr().out
    assert (
        "resuming with max_steps 2 -> 4: the linear decay is recomputed for 4 steps, as transformers does on resume: "
        "learning rate 5e-06 at step 2, decaying to 0 at step 4"
    ) in said


def test_a_setting_that_changes_the_algorithm_still_refuses_a_resume(tmp_path):
    trainer_for(small_config(tmp_path, max_steps=1)).train()
    with pytest.raises(CheckpointError, match=r"other settings \(beta: 0.0 -> 0.04\)"):
        trainer_for(small_config(tmp_path, max_steps=3, beta=0.04)).train(resume_from_checkpoint=True)


def test_use_cpu_trains_on_the_cpu(tmp_path):
    trainer = trainer_for(small_config(tmp_path, max_steps=1, save_strategy="no", use_cpu=True))
    assert trainer.device.type == "cpu" and trainer.accelerator.device.type == "cpu"
    trainer.train()
    assert trainer.state.global_step == 1


def test_trainer_accelerator_is_accelerates_own_made_on_first_use(tmp_path, capsys):
    from accelerate import Accelerator

    trainer = trainer_for(small_config(tmp_path, max_steps=1))
    assert trainer.__dict__.get("_accelerator") is None  # not made until a script asks for it
    accelerator = trainer.accelerator
    assert isinstance(accelerator, Accelerator) and trainer.accelerator is accelerator
    accelerator.print("from trl's grpo.py")  # the line TRL's CLI script runs
    assert accelerator.is_main_process and capsys.readouterr().out == "from trl's grpo.py\n"


def test_importing_minigrpo_imports_no_accelerate_and_no_tracker():
    code = "import sys, minigrpo; print(sorted(m for m in ('accelerate', 'tensorboard', 'wandb') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_every_trl_field_minigrpo_refuses_says_what_to_do_instead():
    trl = pytest.importorskip("trl")
    ours = {f.name for f in dataclasses.fields(GRPOConfig)}
    refused = [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.init and f.name not in ours]
    assert len(refused) > 50  # TrainingArguments' fields and TRL's own
    assert [name for name in refused if instead_of(name) is None] == []
    assert "set eval_steps" in refused_field_message("GRPOConfig", "eval_delay")
    assert "vLLM is TRL's domain" in refused_field_message("GRPOConfig", "vllm_server_port")  # by its prefix
    with pytest.raises(TypeError, match="ddp_timeout=...: .* torchrun and minigrpo set up DDP"):
        GRPOConfig(ddp_timeout=60)


def test_accelerate_launch_that_started_one_process_says_how_to_start_several(monkeypatch):
    from minigrpo.run import distributed

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")  # what `accelerate launch --num_processes 2` sets on a CPU ...
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # ... with no RANK: one process
    with pytest.warns(UserWarning, match="pass --multi_gpu .* or run torchrun --nproc-per-node K"):
        assert distributed.init_from_environment() is False
    monkeypatch.delenv("MASTER_ADDR")  # accelerate launch with one process: nothing to say
    assert distributed.one_process_of_several() is None
