"""What vulture reports unused and something outside the repository uses: scripts/dead_code.py reads this list.

One name a line (`_.name` for an attribute or method), with the reason. Vulture matches names, not definitions: an
entry silences every finding of its name, so scripts/dead_code.py fails on an entry that silences nothing.
"""

# ruff: noqa: B018, F821 (bare names, defined elsewhere)

# --- Python calls them ---------------------------------------------------------------------------------------------
__getattr__  # minigrpo/__init__.py: a module's __getattr__ and __dir__ (PEP 562): the lazy public names
__dir__

# --- transformers and TRL read them --------------------------------------------------------------------------------
_.on_step_begin  # TrainerCallback hooks (bench/, tests/): the Trainer's callback handler calls them
_.on_train_begin
_.best_metric  # run/trl_api.py TrainerState: transformers' fields, read by its trackers' callbacks
_.best_model_checkpoint
_.is_hyper_param_search
_.trial_name
_.total_flos
_.is_world_process_zero
_.is_local_process_zero
_.pop_callback  # run/trl_api.py: transformers Trainer's callback methods, for a TRL user's script
_.remove_callback
_.to_json_string  # config.py: TrainingArguments.to_json_string, which transformers' TensorBoardCallback calls
_.current_gradient_accumulation_steps  # measuring/crosscheck.py: set on TRL's trainer, read by its loss
_._generate_single_turn  # measuring/crosscheck_tools.py: TRL's generation, replaced by the script's turns
_.min_new_tokens  # bench/: a GenerationConfig field, read by generate
_.pre_tokenizer  # tokenization.py: the parts of a `tokenizers` pipeline
_.decoder
_.rope_scaling  # grading/checks/labs.py: transformers 4's Qwen2Config fields, read by its rotary embedding
_.original_max_position_embeddings

# --- peft, nbclient and the standard library read them -------------------------------------------------------------
_.task_type  # ppo.py: a LoraConfig field, read by peft's inject_adapter_in_model
_.handle_comm_msg  # grading/sandbox/kernels.py: nbclient's NotebookClient calls it for each comm message
_.on_cell_executed  # grading/sandbox/kernels.py: nbclient's hook after each cell
_.compress_type  # grading/gradescope.py: a ZipInfo field, read by ZipFile.writestr
_._split_lines  # __main__.py HelpFormatter: argparse's HelpFormatter calls it for each option's help

# --- called by name from a string, in another process --------------------------------------------------------------
limit_kernel_output  # grading/sandbox/limits.py: run in every grading kernel (kernels._CUT_OUTPUT)
serve  # grading/sandbox/remote.py: the kernel runs it for each of the judge's requests
into  # grading/runner.py: `into += chunk` extends the caller's bytearray in place (vulture sees a rebinding)
