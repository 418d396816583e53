"""``python -m gguf_export.chat MODEL.gguf``: talk to an exported model in the terminal, through llama.cpp.

The conversation is rendered with the chat template embedded in the GGUF (the one the export
verified against transformers), never with a format llama-cpp-python guesses from it: a file
without a template is refused. ``--prompt TEXT`` answers once and exits, for scripts. Only the
model's words go to stdout; llama.cpp's own logging is off.

    python -m gguf_export.chat runs/<id>/export/model-q8_0.gguf
    python -m gguf_export.chat model.gguf --prompt "What is the capital of France?" --temperature 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.errors import UserError, exit_on_user_error
from gguf_export.reader import read_gguf

EMBEDDED_TEMPLATE = "chat_template.default"  # llama-cpp-python's name for the GGUF's tokenizer.chat_template
QUIT = {"/exit", "/quit"}
RESET = "/reset"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gguf_export.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="the GGUF file to chat with")
    parser.add_argument("--prompt", help="answer this one message and exit, instead of an interactive chat")
    parser.add_argument("--system", default="", help="a system message that starts the conversation")
    parser.add_argument("--max-tokens", type=int, default=512, help="the longest answer, in tokens (default 512)")
    parser.add_argument("--temperature", type=float, default=0.7, help="0 answers greedily (default 0.7)")
    parser.add_argument(
        "--context", type=int, default=4096, help="tokens of conversation kept, at most the model's (default 4096)"
    )
    args = parser.parse_args(argv)
    if args.max_tokens < 1 or args.context < 64 or args.temperature < 0:
        parser.error("--max-tokens must be at least 1, --context at least 64 and --temperature at least 0")
    return args


def open_model(path: Path, context: int):
    """The GGUF in llama.cpp, set to render with its own embedded chat template.

    The header is read first (``gguf_export.reader`` maps it; no weights are read): a file that is no
    GGUF or has no template is refused before llama.cpp loads it, and the context is capped at the
    model's trained length, past which llama.cpp would warn on every start.
    """
    if not path.is_file():
        raise UserError(f"{path} does not exist. Pass the .gguf file the export stage wrote (runs/<id>/export/).")
    from llama_cpp import Llama

    try:
        fields = read_gguf(path).metadata
    except (ValueError, OSError) as error:
        raise UserError(
            f"{path} is not a GGUF file llama.cpp can read: {error}. Pass the .gguf file the export stage wrote."
        ) from None
    if "tokenizer.chat_template" not in fields:
        raise UserError(
            f"{path} has no chat template (tokenizer.chat_template), so there is no right way to render a "
            "conversation for it. Export from a model directory whose tokenizer has one."
        )
    architecture = fields.get("general.architecture")  # without it llama.cpp refuses the file below
    trained = fields.get(f"{architecture}.context_length")
    n_ctx = min(context, int(trained)) if trained else context
    try:
        return Llama(model_path=str(path), n_ctx=n_ctx, verbose=False, chat_format=EMBEDDED_TEMPLATE)
    except (ValueError, RuntimeError) as error:
        raise UserError(f"llama.cpp could not load {path} ({error}).") from None


def answer(llm, messages: list[dict], args: argparse.Namespace, stream: bool):
    """The assistant's reply to ``messages``: its text, or its text as it is generated."""
    result = llm.create_chat_completion(
        messages, max_tokens=args.max_tokens, temperature=args.temperature, stream=stream
    )
    if not stream:
        return result["choices"][0]["message"]["content"]
    return (chunk["choices"][0]["delta"].get("content", "") for chunk in result)


def opening(args: argparse.Namespace) -> list[dict]:
    """The conversation before the user's first message: the system message, if one was given."""
    return [{"role": "system", "content": args.system}] if args.system else []


def chat(llm, args: argparse.Namespace) -> None:
    """Read a message, print the reply as it comes, keep the conversation until /exit or end of input."""
    messages = opening(args)
    print(f"chatting with {args.model.name}; /reset starts over, /exit or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            text = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if text in QUIT:
            return
        if text == RESET:
            messages = opening(args)
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        print("model> ", end="", flush=True)
        reply = ""
        for piece in answer(llm, messages, args, stream=True):
            reply += piece
            print(piece, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": reply})


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    llm = open_model(args.model, args.context)
    if args.prompt is not None:
        messages = [*opening(args), {"role": "user", "content": args.prompt}]
        print(answer(llm, messages, args, stream=False).strip())
        return
    chat(llm, args)


if __name__ == "__main__":
    main()
