"""The tokenizer of a checkpoint as GGUF metadata (byte-level BPE only).

What llama.cpp needs to tokenize exactly like the Hugging Face tokenizer:

* the token strings in id order, with a type each (normal, control for special
  added tokens, user-defined for other added tokens, unused for holes);
* the merges, the special token ids and whether BOS/EOS are added (via
  ``gguf.SpecialVocab``, which reads tokenizer.json, tokenizer_config.json and
  config.json);
* the pre-tokenizer: llama.cpp re-implements each family's pre-tokenizer regex
  in C++ and picks it by name (``tokenizer.ggml.pre``). Like llama.cpp's
  ``get_vocab_base_pre`` we identify it by tokenizing a fixed test text and
  hashing the ids; an unknown hash is an error rather than a silent default,
  because a wrong pre-tokenizer splits text differently and degrades the model
  without any visible failure.

The tokenizer is read with the ``tokenizers`` library directly (the Rust
library transformers itself uses), which keeps transformers and torch out of
the conversion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import gguf

from common.errors import UserError
from gguf_export.architectures import NeedsLlamaCpp
from gguf_export.chat_formats import chat_format_of

# The text llama.cpp's get_vocab_base_pre tokenizes; its ids' sha256 identifies the pre-tokenizer.
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis "
    "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 "
    "?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? "
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# Hashes of CHECK_TEXT's ids for the families we convert, from llama.cpp's
# get_vocab_base_pre (convert_hf_to_gguf_update.py generates that table).
KNOWN_PRE_TOKENIZERS: dict[str, tuple[str, str]] = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": ("smollm", "SmolLM / SmolLM2"),
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": ("llama-bpe", "Llama 3 (and SmolLM3)"),
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": ("qwen2", "Qwen 1.5 / 2 / 2.5"),
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": ("qwen2", "Qwen 3"),
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": ("tekken", "Mistral (Tekken BPE)"),
}

# TokenizersBackend-style special-looking added tokens that some checkpoints forget to mark special.
CONTROL_LOOKING = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


@dataclass
class Vocabulary:
    """Everything the GGUF's tokenizer.* keys hold."""

    tokens: list[str]
    token_types: list[int]
    pre_tokenizer: str
    special: gguf.SpecialVocab
    end_of_turn_id: int | None
    notes: list[str] = field(default_factory=list)

    def add_to(self, writer: gguf.GGUFWriter) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(self.pre_tokenizer)
        writer.add_token_list(self.tokens)
        writer.add_token_types(self.token_types)
        self.special.add_to_gguf(writer, quiet=True)
        if self.end_of_turn_id is not None:
            writer.add_eot_token_id(self.end_of_turn_id)


def load_tokenizer(model_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The checkpoint's ``tokenizers.Tokenizer`` and tokenizer.json's content, from one read of the file;
    a clear error for missing or SentencePiece-only tokenizers."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        if (model_dir / "tokenizer.model").is_file():
            raise NeedsLlamaCpp(
                f"{model_dir} has only a SentencePiece tokenizer.model, no tokenizer.json; the built-in converter "
                "handles byte-level BPE tokenizers. Set LLAMA_CPP_DIR to a llama.cpp checkout to convert it with "
                "llama.cpp's convert_hf_to_gguf.py."
            )
        raise UserError(
            f"{model_dir} has no tokenizer.json: the tokenizer files are missing. Save the tokenizer next to the "
            "weights (tokenizer.save_pretrained(dir)) so the GGUF can carry the vocabulary and chat template."
        )
    try:
        text = path.read_text(encoding="utf-8")
        return Tokenizer.from_str(text), json.loads(text)
    except Exception as error:  # tokenizers raises a bare Exception for unreadable files
        raise UserError(
            f"{path} cannot be loaded by the tokenizers library ({error}); copy the tokenizer files again."
        ) from None


def check_byte_level_bpe(model_dir: Path, spec: dict[str, Any]) -> None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or (model_dir / "tokenizer.model").is_file():
        raise NeedsLlamaCpp(
            f"{model_dir / 'tokenizer.json'} is a {model.get('type')} tokenizer"
            f"{' with byte fallback (SentencePiece style)' if model.get('byte_fallback') else ''}; "
            "the built-in converter handles byte-level BPE tokenizers (SmolLM, Llama 3, Qwen, Mistral Tekken). "
            "Set LLAMA_CPP_DIR to a llama.cpp checkout to convert it with llama.cpp's convert_hf_to_gguf.py."
        )


def identify_pre_tokenizer(tokenizer, model_dir: Path, override: str = "") -> str:
    """llama.cpp's name of the checkpoint's pre-tokenizer (or ``override`` when given)."""
    if override:
        return override
    checksum = sha256(str(tokenizer.encode(CHECK_TEXT).ids).encode()).hexdigest()
    if checksum in KNOWN_PRE_TOKENIZERS:
        return KNOWN_PRE_TOKENIZERS[checksum][0]
    families: dict[str, list[str]] = {}
    for name, family in KNOWN_PRE_TOKENIZERS.values():
        families.setdefault(name, []).append(family)
    known = "; ".join(f"{name} ({', '.join(names)})" for name, names in families.items())
    raise UserError(
        f"The tokenizer in {model_dir} is not one of the known families ({known}): its pre-tokenizer check hash is "
        f"{checksum}. If you know which llama.cpp pre-tokenizer it uses, pass it explicitly with --pre-tokenizer NAME "
        "(for example --pre-tokenizer llama-bpe); otherwise set LLAMA_CPP_DIR to convert with llama.cpp."
    )


def token_strings(tokenizer, vocab_size: int, model_dir: Path) -> tuple[list[str], list[int]]:
    """Token strings and types in id order, like llama.cpp's ``get_vocab_base``."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    highest = max(vocab.values())
    if highest >= vocab_size:
        raise UserError(
            f"Vocabulary size mismatch in {model_dir}: the tokenizer has token id {highest} but config.json says "
            f"vocab_size {vocab_size}. The tokenizer does not belong to these weights (or tokens were added without "
            "resizing the embeddings): save the tokenizer that was used for training together with the model."
        )
    added = tokenizer.get_added_tokens_decoder()
    reverse = {token_id: text for text, token_id in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for token_id in range(vocab_size):
        if token_id not in reverse:
            tokens.append(f"[PAD{token_id}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        text = reverse[token_id]
        if token_id in added:
            entry = added[token_id]
            if not entry.normalized:
                # llama.cpp expects added tokens pre-normalised: store what the tokenizer round-trips them to.
                text = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if entry.special or looks_special(text):
                types.append(gguf.TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(text)
    return tokens, types


def looks_special(text: str) -> bool:
    return (
        text in CONTROL_LOOKING
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<｜") and text.endswith("｜>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def adds_token(tokenizer, token_id: int | None, first: bool) -> bool:
    """Whether the Hugging Face tokenizer itself adds ``token_id`` at the start (``first``) or end of a text.

    Asking the tokenizer is the ground truth the GGUF must reproduce; reading the
    flags from tokenizer_config.json or the post-processor disagrees between
    files and library versions.
    """
    if token_id is None:
        return False
    ids = tokenizer.encode("a").ids
    return bool(ids) and ids[0 if first else -1] == token_id


def load_vocabulary(model_dir: Path, vocab_size: int, pre_tokenizer_override: str = "") -> Vocabulary:
    tokenizer, spec = load_tokenizer(model_dir)
    check_byte_level_bpe(model_dir, spec)
    pre = identify_pre_tokenizer(tokenizer, model_dir, pre_tokenizer_override)
    tokens, types = token_strings(tokenizer, vocab_size, model_dir)
    special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens))
    if not special.merges:
        raise UserError(
            f"{model_dir / 'tokenizer.json'} has no BPE merges; the tokenizer file is incomplete. "
            "Save the tokenizer again."
        )
    add_bos = adds_token(tokenizer, special.special_token_ids.get("bos"), first=True)
    add_eos = adds_token(tokenizer, special.special_token_ids.get("eos"), first=False)
    special.add_special_token = {"bos": add_bos, "eos": add_eos}
    template = special.chat_template if isinstance(special.chat_template, str) else None
    fmt = chat_format_of(template)
    end_of_turn = tokenizer.token_to_id(fmt.end_of_turn) if fmt else None
    notes = [] if template else [f"{model_dir} has no chat template: the GGUF cannot format chats by itself."]
    return Vocabulary(tokens, types, pre, special, end_of_turn, notes)
