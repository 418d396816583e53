"""An Ollama ``Modelfile`` beside the GGUF, so ``ollama create NAME -f Modelfile`` works as is.

It names the GGUF by a relative path, carries a Go TEMPLATE that renders a
conversation exactly as the checkpoint's Jinja chat template does (tests render
both and compare), a SYSTEM line when the Jinja template injects a default
system prompt (Ollama then inserts it the same way), the stop strings of the
chat format, and a few defaults: temperature and top_p from
generation_config.json when the model ships them, and a context window no
larger than the model's trained length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.errors import UserError
from gguf_export.chat_formats import ChatFormat, chat_format_of

DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9
MAX_NUM_CTX = 4096  # Ollama allocates the KV cache for num_ctx up front; 4096 suits small models on laptops
PROBE = "PROBE-USER-MESSAGE"


def render_jinja(
    template: str, messages: list[dict[str, str]], special: dict[str, str], generation_prompt: bool = True
) -> str:
    """Render a Hugging Face chat template the way transformers does (same Jinja settings)."""
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise UserError(f"the chat template refused the probe conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(template).render(messages=messages, add_generation_prompt=generation_prompt, **special)


def default_system_prompt(template: str, fmt: ChatFormat, special: dict[str, str]) -> str | None:
    """The system prompt the Jinja template inserts when a conversation has none, if any."""
    before, after = fmt.system_turn
    if not before:
        return None
    rendered = render_jinja(template, [{"role": "user", "content": PROBE}], special)
    start = rendered.find(before)
    if start < 0 or start > rendered.find(PROBE):
        return None
    content_start = start + len(before)
    return rendered[content_start : rendered.index(after, content_start)]


def special_tokens(model_dir: Path) -> dict[str, str]:
    """bos_token / eos_token strings as the Jinja template sees them."""
    path = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    found = {}
    for key in ("bos_token", "eos_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            found[key] = value
    return found


def quoted(text: str) -> str:
    if '"""' in text:
        raise UserError(
            'the chat template or system prompt contains """, which a Modelfile cannot quote; '
            "write the Modelfile by hand."
        )
    return f'"""{text}"""'


def modelfile_text(gguf_name: str, chat_template: str | None, model_dir: Path, context_length: int) -> str:
    """The Modelfile for ``gguf_name`` (a file in the same directory)."""
    fmt = chat_format_of(chat_template)
    if fmt is None:
        raise UserError(
            f"{model_dir}: the checkpoint has {'an unrecognised' if chat_template else 'no'} chat template, "
            "so no Ollama Modelfile can be written that chats like the model was trained to (known formats: "
            "ChatML <|im_start|>, Llama 3 <|start_header_id|>, Mistral [INST]). "
            "Save the chat model's tokenizer with the checkpoint."
        )
    generation_path = model_dir / "generation_config.json"
    generation = json.loads(generation_path.read_text(encoding="utf-8")) if generation_path.is_file() else {}
    special = special_tokens(model_dir)
    lines = ["# Ollama Modelfile written by gguf_export: ollama create <name> -f Modelfile", f"FROM ./{gguf_name}", ""]
    if fmt.ollama_template is not None:
        lines += [f"TEMPLATE {quoted(fmt.ollama_template)}", ""]
    else:
        lines += [
            f"# TEMPLATE omitted: {fmt.name} chat templates differ between releases; Ollama derives it from the",
            "# chat template embedded in the GGUF (tokenizer.chat_template).",
            "",
        ]
    system = default_system_prompt(chat_template, fmt, special)
    if system:
        lines += [f"SYSTEM {quoted(system)}", ""]
    lines += [f'PARAMETER stop "{stop}"' for stop in fmt.stop]
    temperature = generation.get("temperature", DEFAULT_TEMPERATURE) if generation.get("do_sample", True) else 0.0
    lines += [
        f"PARAMETER temperature {temperature}",
        f"PARAMETER top_p {generation.get('top_p', DEFAULT_TOP_P)}",
        f"PARAMETER num_ctx {min(context_length, MAX_NUM_CTX)}",
        "",
    ]
    return "\n".join(lines)
