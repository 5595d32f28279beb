"""The sandbox: where a learner's code runs while it is graded, and what the grader lets out of it.

Learner code is hostile, by construction. It runs in the notebook's own kernel, never in the grader's or the judge's
process, and only plain data comes back:

| module | job |
| --- | --- |
| kernels | the notebook's kernel as the grader runs it: its own stdout and files, capped messages, no frontend |
| remote | the learner's function called in its kernel by the judge: arguments in, plain data out |
| limits | how much of a notebook the grader reads (regular files, size, output caps), printed escaped |
| processes | the grader's process hygiene: kill all a kernel started, start the judge isolated, stop on a signal |

Nothing here knows an exercise: the checks (`grading.checks`) never import the sandbox, nor the sandbox the checks.
`kernels` needs the `grade` extra (jupyter_client, nbclient, zmq) and is imported only when a notebook is graded,
so this package imports none of its modules.
"""
