# The tiny testbed config (TINY, read_jsonl, without_times) lives in tests/helpers.py (`from helpers import TINY`);
# the `tiny_overrides` fixture lives in tests/conftest.py. Never `from conftest import ...`: several conftest.py exist.
