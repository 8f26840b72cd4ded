"""Token counts for a reply whose server sent no usage: the tokenizer named by
`AGENTQ_TOKENIZER` (Settings.tokenizer), loaded once per process, or characters / 4."""
from __future__ import annotations

import logging
import math
import threading
from typing import Callable, Iterable

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
"""Token estimate when a server sends no usage and no tokenizer is configured:
ceil(characters / CHARS_PER_TOKEN). How missing usage is counted is Settings.tokenizer:
unset or `chars`, `tiktoken[:encoding]`, or the path of a .gguf file (that model's own
tokenizer, through llama_cpp, vocabulary only)."""


def _estimate_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


class _Tokenizers:
    """Counters for missing usage, loaded once per spec; characters / 4 when none loads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, Callable[[str], int] | None] = {}

    def count(self, spec: str | None, texts: Iterable[str]) -> int:
        texts = [t for t in texts if t]
        counter = self.get(spec)
        if counter is None:
            return _estimate_tokens(sum(len(t) for t in texts))
        with self._lock:  # llama_cpp's tokenizer is not documented as thread-safe
            return sum(counter(t) for t in texts)

    def get(self, spec: str | None) -> Callable[[str], int] | None:
        spec = (spec or "").strip()
        if not spec or spec == "chars":
            return None
        with self._lock:
            if spec not in self._loaded:
                self._loaded[spec] = self._load(spec)
            return self._loaded[spec]

    @staticmethod
    def _load(spec: str) -> Callable[[str], int] | None:
        try:
            if spec.startswith("tiktoken"):
                import tiktoken
                encoding = tiktoken.get_encoding(spec.partition(":")[2] or "o200k_base")
                return lambda text: len(encoding.encode(text, disallowed_special=()))
            if spec.endswith(".gguf"):
                import llama_cpp
                vocab = llama_cpp.Llama(model_path=spec, vocab_only=True, verbose=False)
                return lambda text: len(vocab.tokenize(text.encode("utf-8", "replace"),
                                                       add_bos=False, special=True))
            raise ValueError("expected chars, tiktoken[:encoding] or a .gguf path")
        except Exception as exc:  # noqa: BLE001 - any failure falls back to characters / 4
            log.warning("tokenizer %s unavailable (%s: %s); counting characters / %d",
                        spec, type(exc).__name__, exc, CHARS_PER_TOKEN,
                        extra={"event": "llm.tokenizer_unavailable", "tokenizer": spec})
            return None




_tokenizers = _Tokenizers()


def count_tokens(spec: str | None, texts: Iterable[str]) -> int:
    """The tokens of `texts` by the tokenizer `spec` (Settings.tokenizer); characters / 4
    when it is unset, `chars`, or does not load."""
    return _tokenizers.count(spec, texts)
