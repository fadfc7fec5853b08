"""Verifiable tasks: the embedded testbed (synthetic addition) and math (math-verify)."""
