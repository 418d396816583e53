"""The chat formats we recognise in a checkpoint's Jinja chat template.

One format per model family: how a turn is framed, which token ends a turn
(the end-of-turn id written into the GGUF, the stop token of the Ollama
Modelfile) and, where we have one, the Go template Ollama renders the same
conversation with. Recognition is by the template's own markers, so a
fine-tune that keeps its base model's template is recognised whatever it is
called.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ollama's Go templates (text/template). ``.Messages`` holds every message of the
# request, the Modelfile's SYSTEM included; ``$last`` marks the final message,
# after which the assistant turn is opened.
CHATML_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}
{{- end }}"""

LLAMA3_TEMPLATE = """<|begin_of_text|>
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>
{{- if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}"""


@dataclass(frozen=True)
class ChatFormat:
    """One family's chat framing."""

    name: str
    marker: str  # a string only this family's Jinja template contains
    end_of_turn: str  # the token that ends an assistant turn
    ollama_template: str | None  # None: Ollama derives it from the GGUF's embedded template
    stop: tuple[str, ...]  # Ollama stop strings
    system_turn: tuple[str, str]  # how the Jinja template frames a system turn: (before, after) its content


CHAT_FORMATS: tuple[ChatFormat, ...] = (
    ChatFormat(
        "chatml",
        "<|im_start|>",
        "<|im_end|>",
        CHATML_TEMPLATE,
        ("<|im_start|>", "<|im_end|>"),
        ("<|im_start|>system\n", "<|im_end|>"),
    ),
    ChatFormat(
        "llama3",
        "<|start_header_id|>",
        "<|eot_id|>",
        LLAMA3_TEMPLATE,
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        ("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>"),
    ),
    # Mistral's [INST] templates differ between releases (v1, v3, v7, Tekken); rather than guess,
    # the Modelfile leaves TEMPLATE out and Ollama matches the GGUF's embedded template itself.
    ChatFormat("mistral", "[INST]", "</s>", None, ("[INST]", "[/INST]", "</s>"), ("", "")),
)


def chat_format_of(template: str | None) -> ChatFormat | None:
    """The recognised format of a Jinja chat template, or None."""
    if not template:
        return None
    return next((fmt for fmt in CHAT_FORMATS if fmt.marker in template), None)
