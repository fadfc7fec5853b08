"""`python -m grpo_replay.cli ...` runs the `grpo-replay` command."""
import sys

from . import main

sys.exit(main())
