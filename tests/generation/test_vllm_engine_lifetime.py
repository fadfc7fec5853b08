"""The vLLM backend's process hygiene, without vLLM (no GPU here): a colocated engine gets a free rendezvous port
(not a fixed one that the next run on the host collides with), and close() tears the engine down. vLLM itself is
replaced by a recording stand-in: it needs a GPU."""
import os
import socket
import types

import pytest

from grpo_replay.generation.vllm import VLLMGenerator, free_port
from helpers import LAUNCH_VARS, restore_after


def test_free_port_is_bindable():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


@pytest.fixture
def recorded(monkeypatch):
    """VLLMGenerator.__init__ replaced by a recorder of its arguments and of MASTER_PORT at engine start."""
    calls = []

    def init(self, model_path, tokenizer, add_special_tokens=True, *, policy=None, sample_seed=0, **kw):
        calls.append({"port": os.environ.get("MASTER_PORT"), **kw})
        self.llm = None

    monkeypatch.setattr(VLLMGenerator, "__init__", init)
    restore_after(monkeypatch, *LAUNCH_VARS)  # unset here, and what colocated() writes is undone after
    return calls


@pytest.mark.parametrize("preset", [None, "0", "auto"])
def test_colocated_engine_picks_a_free_port(recorded, monkeypatch, preset):
    if preset is not None:
        monkeypatch.setenv("MASTER_PORT", preset)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 29533))  # the port that used to be fixed is busy: the engine must not need it
    try:
        VLLMGenerator.colocated(types.SimpleNamespace(name_or_path="m"), None, max_model_len=64, seed=0)
    finally:
        taken.close()
    port = recorded[0]["port"]
    assert port not in (None, "0", "auto", "29533") and int(port) > 0
    assert recorded[0]["distributed_executor_backend"] == "external_launcher"


def test_a_port_the_caller_chose_is_kept(recorded, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "31234")
    VLLMGenerator.colocated(types.SimpleNamespace(name_or_path="m"), None, max_model_len=64, seed=0)
    assert recorded[0]["port"] == "31234"


def test_close_shuts_the_engine_down_once(monkeypatch):
    shut = []
    gen = object.__new__(VLLMGenerator)
    gen.llm = types.SimpleNamespace(llm_engine=types.SimpleNamespace(shutdown=lambda: shut.append(1)))
    gen.close()
    gen.close()  # idempotent: the trainer and the evaluation both close what they made
    assert shut == [1] and gen.llm is None
