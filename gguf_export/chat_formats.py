"""The chat formats we recognise in a checkpoint's Jinja chat template.

One format per model family: how a turn is framed, which token ends a turn
(the end-of-turn id written into the GGUF, the stop token of the Ollama
Modelfile) and the Go template Ollama renders the same conversation with.
Recognition is by the template's own markers, so a fine-tune that keeps its base
model's template is recognised whatever it is called.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.errors import UserError

# Ollama's Go templates. ``.Messages`` holds every message of the request (system
# included); ``$last`` is true for the final one, after which the assistant turn is opened.
CHATML_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ if $last }}<|im_start|>assistant
{{ end }}
{{- end }}"""

LLAMA3_TEMPLATE = """<|begin_of_text|>
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>
{{- if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}"""

MISTRAL_TEMPLATE = """{{- range $i, $_ := .Messages }}
{{- if eq .Role "user" }}[INST] {{ if and (eq (len (slice $.Messages $i)) 1) $.System }}{{ $.System }}

{{ end }}{{ .Content }}[/INST]
{{- else if eq .Role "assistant" }} {{ .Content }}</s>
{{- end }}
{{- end }}"""


@dataclass(frozen=True)
class ChatFormat:
    """One family's chat framing."""

    name: str
    marker: str  # a string only this family's Jinja template contains
    end_of_turn: str  # the token that ends an assistant turn
    ollama_template: str
    stop: tuple[str, ...]  # Ollama stop strings


CHAT_FORMATS: tuple[ChatFormat, ...] = (
    ChatFormat("chatml", "<|im_start|>", "<|im_end|>", CHATML_TEMPLATE, ("<|im_start|>", "<|im_end|>")),
    ChatFormat("llama3", "<|start_header_id|>", "<|eot_id|>", LLAMA3_TEMPLATE, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    ChatFormat("mistral", "[INST]", "</s>", MISTRAL_TEMPLATE, ("[INST]", "[/INST]", "</s>")),
)


def chat_format_of(template: str | None) -> ChatFormat | None:
    """The recognised format of a Jinja chat template, or None."""
    if not template:
        return None
    return next((fmt for fmt in CHAT_FORMATS if fmt.marker in template), None)


def require_chat_format(template: str | None, where: str) -> ChatFormat:
    """Like ``chat_format_of`` but a clear error when there is no template or it is unknown."""
    if not template:
        raise UserError(
            f"{where} has no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja); "
            "an Ollama Modelfile and a chat verification need one. Save the tokenizer of the chat model with the checkpoint."
        )
    fmt = chat_format_of(template)
    if fmt is None:
        raise UserError(
            f"{where}: the chat template is not one of the known formats ({', '.join(f.name for f in CHAT_FORMATS)}: "
            "recognised by <|im_start|>, <|start_header_id|> or [INST]), so no Ollama TEMPLATE can be derived for it. "
            "The GGUF itself carries the Jinja template; write the Modelfile TEMPLATE by hand for this model."
        )
    return fmt
