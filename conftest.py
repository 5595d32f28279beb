"""Every pytest run (unit tests, and nbval over notebooks/ or solutions/) is offline and in quick mode.

nbval's kernels inherit this process's environment, so the notebooks see the same settings. Being at the
root, this applies to `python -m pytest`, `pytest notebooks/` and `pytest solutions/` alike. A learner's
Jupyter never reads it.
"""

import os

os.environ.setdefault("MINIGRPO_QUICK", "1")  # minigrpo.course.QUICK: short training runs
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in CI logs
# transformers and huggingface_hub pass tqdm an explicit `disable`, so TQDM_DISABLE misses their bars (transformers 5
# draws "Loading weights" as a widget, which nbval would see as an unexpected output of a checked cell).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# Under pytest-xdist (pyproject.toml's addopts) each worker, and each kernel or process a test starts, computes on one
# thread: with torch's default, a thread per core in every worker, the workers' OpenMP threads spin against each
# other and in-process training tests ran ten times slower. xdist sets the count before this file is read.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"
