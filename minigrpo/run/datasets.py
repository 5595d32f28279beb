"""What a trainer accepts as its prompts: the forms TRL accepts, with one clear error for anything else.

| given                        | what happens                                                                |
| ---------------------------- | --------------------------------------------------------------------------- |
| ``datasets.Dataset``         | used as is                                                                  |
| ``datasets.IterableDataset`` | the rows the run will draw are read once into a Dataset (it has no length,  |
|                              | and a resumed run must see the same prompts): max_steps must be given       |
| a list of dicts, a dict of   | TypeError saying how to convert it (Dataset.from_list / from_dict /         |
| lists, a pandas DataFrame    | from_pandas), before any model is loaded                                    |

Each prompt is then checked (``check_prompts``): a string or a list of chat messages, never None, a number or
empty, with the row named, so that a bad row fails at once rather than steps later inside the chat template or
the model.
"""

from __future__ import annotations

import itertools

MAX_EVAL_ROWS = 100_000
"""The most rows an IterableDataset given as eval_dataset may hold: evaluation reads every one of them."""

_CONVERSIONS = {  # type -> (what it is, how to convert it)
    list: ("a list of rows", "Dataset.from_list(rows)"),
    tuple: ("a tuple of rows", "Dataset.from_list(list(rows))"),
    dict: ("a dict of columns", "Dataset.from_dict(columns)"),
}


def as_dataset(dataset, name: str, config=None):
    """`dataset` as a datasets.Dataset (None stays None).

    name: the argument ("train_dataset", "eval_dataset"), for the errors. config: given for the training set,
    whose IterableDataset is read only as far as config.max_steps draws (iterable_rows_needed); without it, every
    row is read (at most MAX_EVAL_ROWS). The rows are read in order, so a resumed run, and every process under
    torchrun, sees the same ones.
    """
    from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

    if dataset is None or isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, IterableDataset):
        num_rows = iterable_rows_needed(config, name) if config is not None else None
        limit = MAX_EVAL_ROWS + 1 if num_rows is None else num_rows
        rows = list(itertools.islice(dataset, limit))
        if num_rows is None and len(rows) > MAX_EVAL_ROWS:
            raise ValueError(
                f"{name} is an IterableDataset of more than {MAX_EVAL_ROWS:,} rows, all of which evaluation would "
                f"read: take a held-out sample, e.g. Dataset.from_list(list({name}.take(1000)))."
            )
        return Dataset.from_list(rows)
    if isinstance(dataset, DatasetDict | IterableDatasetDict):
        raise TypeError(f"{name} is a DatasetDict of splits {list(dataset)}: pass one split, e.g. dataset['train'].")
    what, fix = _CONVERSIONS.get(type(dataset), (f"a {type(dataset).__name__}", "Dataset.from_list(rows)"))
    if type(dataset).__module__.startswith("pandas"):
        what, fix = "a pandas DataFrame", "Dataset.from_pandas(frame, preserve_index=False)"
    raise TypeError(
        f"{name} is {what}, but the trainer takes a datasets.Dataset or IterableDataset (as TRL does) with a "
        f"'prompt' column: convert it with `from datasets import Dataset; {fix}`."
    )


def iterable_rows_needed(config, name: str) -> int:
    """How many prompts a run of config.max_steps draws: the rows to read from an IterableDataset train set."""
    if config.max_steps < 1:
        raise ValueError(
            f"{name} is an IterableDataset, which has no length, so max_steps=-1 (num_train_epochs passes over "
            "it) cannot be counted: give max_steps (as TRL requires for an IterableDataset)."
        )
    generations = -(-config.max_steps // config.optimizer_steps_per_generation)  # ceil
    return generations * config.prompts_per_step


def check_prompts(prompts, name: str) -> None:
    """Every prompt a non-empty string or a non-empty list of chat messages ({"role": ..., "content": ...})."""
    for row, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            problem = "an empty string" if not prompt.strip() else None
        elif isinstance(prompt, list):
            messages_ok = prompt and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
            problem = None if messages_ok else "a list that is not chat messages ({'role': ..., 'content': ...})"
        else:
            problem = f"{prompt!r} of type {type(prompt).__name__}"
        if problem:
            raise ValueError(
                f"{name} row {row}: the prompt is {problem}, but a prompt is a non-empty string or a list of chat "
                f"messages. Fix or drop that row (e.g. {name}.filter(lambda row: bool(row['prompt'])))."
            )
