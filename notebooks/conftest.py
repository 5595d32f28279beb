"""nbval runs these notebooks offline and in quick mode (the kernels inherit this process's environment).

`python -m pytest` also loads tests/conftest.py, which sets the same; this file makes
`python -m pytest notebooks/` alone behave the same way. A learner's Jupyter never reads it.
"""

import os

os.environ.setdefault("MINIGRPO_QUICK", "1")  # minigrpo.course.QUICK: short training runs
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars in CI logs
