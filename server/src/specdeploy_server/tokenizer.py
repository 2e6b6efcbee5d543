"""Tokenizer access and chat templates, independent of the model backend."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger(__name__)

CHAT_TEMPLATE_FILE = "chat_template.j2"


class ChatTemplateError(ValueError):
    """The model has no chat template, or rendering it failed for these messages."""


class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]
    #: the most characters one token stands for (None: unknown), so ``len(text) / max_chars_per_token`` is a
    #: lower bound of the tokens of ``text``: the serving layer refuses a prompt that cannot fit the context
    #: before tokenising it
    max_chars_per_token: int | None
    #: the chat template renders the ``tools`` it is given (so a model can decide to call one)
    supports_tools: bool

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str: ...


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A Hugging Face style Jinja chat template, rendered in a sandbox."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        #: a template that mentions ``tools`` renders them (Hugging Face templates of tool-calling models do)
        self.renders_tools = "tools" in source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """``tools`` (OpenAI tool definitions) are passed as the ``tools`` variable, as Hugging Face's
        ``apply_chat_template`` does; a template that does not use them ignores them."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=tools,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def find_chat_template(model_dir: Path, override: Path | None) -> str | None:
    """An explicit file wins, then ``chat_template.j2`` beside the model; None means use the tokenizer's."""
    if override is not None:
        return override.read_text(encoding="utf-8")
    candidate = model_dir / CHAT_TEMPLATE_FILE
    if candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    return None


def longest_token(tok: Any) -> int | None:
    """The longest vocabulary entry, in characters of its token string. Byte-level BPE writes each byte as
    one character and SentencePiece each character as itself, so no token decodes to more characters than
    its string has (a normaliser that deletes characters would break this bound; LLM tokenizers have none)."""
    try:
        vocab = tok.get_vocab()
    except (AttributeError, NotImplementedError):
        return None
    return max((len(token) for token in vocab), default=0) or None


class HFTokenizer:
    """A Hugging Face tokenizer from local files (``tokenizer.json`` + ``tokenizer_config.json``)."""

    def __init__(self, path: Path, chat_template: Path | None = None) -> None:
        # lazy: the package must import without transformers
        from transformers import AutoTokenizer  # noqa: PLC0415

        self._tok: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        eos: set[int] = set()
        if self._tok.eos_token_id is not None:
            eos.add(int(self._tok.eos_token_id))
        gen_config = path / "generation_config.json"
        if gen_config.is_file():
            value = json.loads(gen_config.read_text(encoding="utf-8")).get("eos_token_id")
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list):
                eos.update(int(v) for v in value)
        self.eos_token_ids = frozenset(eos)
        self.max_chars_per_token = longest_token(self._tok)
        source = find_chat_template(path, chat_template) or getattr(self._tok, "chat_template", None)
        self._chat: ChatTemplate | None = None
        if isinstance(source, str) and source:
            self._chat = ChatTemplate(source, self._tok.bos_token or "", self._tok.eos_token or "")
        else:
            log.warning("no chat template for %s: /v1/chat/completions will answer 400", path)
        self.supports_tools = self._chat is not None and self._chat.renders_tools

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's own end-of-sequence token (TensorRT-LLM requests take one ``end_id``)."""
        value = self._tok.eos_token_id
        return None if value is None else int(value)

    @property
    def pad_token_id(self) -> int | None:
        value = self._tok.pad_token_id
        return None if value is None else int(value)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    @property
    def hf(self) -> Any:
        """The Hugging Face tokenizer itself (structured output compiles grammars against it)."""
        return self._tok

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        if self._chat is None:
            raise ChatTemplateError(
                "this model has no chat template (add chat_template.j2 or set serving.chatTemplate)"
            )
        return self._chat.render(messages, tools=tools)
