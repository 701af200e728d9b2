"""A tiny random Llama with a tiny word-level tokenizer saved as a model folder, and an in-process server.

The tokenizer is built here (no download): the 500 most common words of the standard library's
pydoc topics, split on whitespace, plus an end-of-sequence token and a chat template. Its decoding
joins words with spaces, so the expected text of any token sequence is known exactly.
"""

from __future__ import annotations

import collections
import contextlib
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<unk>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False)
STARTUP_TIMEOUT_S = 60


def words() -> list[str]:
    import pydoc_data.topics as topics

    counts = collections.Counter(re.findall(r"[a-z]+", " ".join(topics.topics.values()).lower()))
    return [w for w, _ in counts.most_common(500)]


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = SPECIAL + words()
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="</s>", pad_token="</s>",
                                  additional_special_tokens=SPECIAL[2:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A saved model folder (safetensors + tokenizer) of a seeded random Llama."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("tiny-serve")
    tok = build_tokenizer()
    config = AutoConfig.for_model("llama", vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                  bos_token_id=None, pad_token_id=tok.eos_token_id, **TINY)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: no near-tied logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def expected_text(tokenizer: Any, prompt_ids: list[int], output_ids: list[int]) -> str:
    """The text of `output_ids` after the prompt, as transformers' pipeline computes it."""
    skip = dict(skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return tokenizer.decode(prompt_ids + output_ids, **skip)[len(tokenizer.decode(prompt_ids, **skip)):]


@contextlib.contextmanager
def running_server(model: Any, tokenizer: Any, **config: Any) -> Iterator[tuple[str, Any]]:
    """Serve `model` on 127.0.0.1 (a free port) from a thread; yields (base URL, server state)."""
    from optimum_amdx.serving.app import build_app
    from optimum_amdx.serving.server import ServeConfig, build_state, make_server

    cfg = ServeConfig(model=config.pop("model_name", "tiny"), log_level="warning", **config)
    state = build_state(model, tokenizer, cfg)
    server = make_server(build_app(state), cfg, state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(autouse=True)
def _two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)
