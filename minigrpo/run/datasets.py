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
the model. A column named as a keyword the trainer gives reward functions (``completions``, ...) is refused
(``check_columns``): it would replace what they receive.

A checkpoint records the training set it was trained on (``dataset_record``: rows, columns, a fingerprint of
every value in order), so that a resume on another set is refused instead of applying the prompt sampler's
position to other prompts.
"""

from __future__ import annotations

import hashlib
import itertools
import json

from minigrpo.rewards import RESERVED_COLUMNS

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


def check_columns(column_names: list[str], name: str) -> None:
    """Refuse a column named as a keyword the trainer passes to every reward function (rewards.RESERVED_COLUMNS:
    prompts, completions, completion_ids, trainer_state, log_extra, log_metric): the dataset's other columns
    reach reward functions as keywords of the same names, so it would replace the completions (or the ids, the
    state) they score. TRL fails on `prompts` and `completions` and drops the others."""
    reserved = [column for column in column_names if column in RESERVED_COLUMNS]
    if reserved:
        raise ValueError(
            f"{name} has a column named {reserved[0]!r}, a keyword the trainer gives every reward function "
            f"({', '.join(RESERVED_COLUMNS)}): it would replace what they receive. Rename it, e.g. "
            f"{name}.rename_column({reserved[0]!r}, 'reference_{reserved[0]}')."
        )


def dataset_record(dataset) -> dict:
    """What a checkpoint records of the training set: {"rows", "columns", "fingerprint", "first_prompt"}.

    The fingerprint is a SHA-256 of every column's values, row by row in order (as JSON), so it changes when a row,
    the rows' order or a column changes, and not when the same rows are built again (datasets' own _fingerprint
    is random for a dataset made in memory). The prompt sampler's position indexes this order: another set, even
    of the same length, is other prompts.
    """
    digest = hashlib.sha256(json.dumps(sorted(dataset.column_names)).encode())
    for batch in dataset.iter(batch_size=1000):  # (columns -> values of up to 1000 rows), in row order
        digest.update(json.dumps(batch, sort_keys=True, default=str).encode())
    first = dataset[0]["prompt"] if len(dataset) else None
    first_text = first if isinstance(first, str) else (first[-1].get("content") if first else None)
    return {
        "rows": len(dataset),
        "columns": sorted(dataset.column_names),
        "fingerprint": digest.hexdigest(),
        "first_prompt": None if first_text is None else str(first_text)[:60],
    }
