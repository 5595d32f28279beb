"""Tasks: problems, prompts and reward functions."""
