"""The offline GPU check: the first thing to run on a fresh GPU node (`scripts/gpu_check.sh`, or
`python -m grpo_replay.preflight.gpu_check`). It uses the installed torch, downloads nothing, makes no environment,
and writes one JSON and one Markdown report saying what passed, what failed and what was skipped, and why:

  testbed   the main job (`grpo-replay train`, the paper's method on the embedded testbed) on the device: its
            held-out figures and step time (testbed_job.py)
  memory    one training step of Qwen3-shaped models with random weights (built from a config) at the paper
            recipe's per-GPU shapes: peak memory per phase beside the preflight's estimate for that launch
            (paper_step.py)
  scoring   the chunked log-prob scoring's peak beside its estimate (paper_step.py)
  trl       `ReplayGRPOTrainer` for 2 steps with a tiny random Qwen3 and transformers generation, replay rows
            reaching the loss (trl_replay.py)
  vllm      never started here; the report says whether it is installed (the recipes' generation runs in it)

`--device cpu --tiny` is its dry run, in the test suite: every check at toy shapes, the reports' structure.
"""
