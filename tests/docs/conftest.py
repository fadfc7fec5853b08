"""The docs' GPU commands, collected once per test module (tests/gpu_commands.py) for the test_gpu_commands files."""
import pytest

import gpu_commands as gc


@pytest.fixture(scope="module")
def doc_records(tmp_path_factory):
    return gc.doc_commands(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return gc.smoke_commands(tmp_path_factory.mktemp("smoke"))
