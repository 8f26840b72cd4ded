"""A small embedding model that an installed package ships, for memory offline.

WordLlama (`wordllama`, in the `local` extra) ships its `l2_supercat` model inside its
wheel: a 16 MB token-embedding table (256 dimensions, distilled from Llama 2's embeddings)
and its tokenizer. A text's vector is the mean of its tokens' rows, normalised — no network,
no torch, a millisecond a sentence. We read the two files ourselves and pool as
`WordLlamaInference.embed(norm=True)` does: the package's own `WordLlama.load()` looks for
the tokenizer in a folder the wheel does not have and then downloads it from a hub, and
importing the package configures the root logger.

The local model server (`agentq.local_server`) answers `POST /v1/embeddings` with it, so
`agentq run`/`dev` remember and recall with no provider configured.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

EMBEDDING_MODEL = "wordllama-l2-supercat-256"
"""The name the local server answers to (AGENTQ_EMBEDDING_MODEL)."""
EMBEDDING_DIMENSIONS = 256
PACKAGE = "wordllama"
WEIGHTS = "weights/l2_supercat_256.safetensors"
TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
TENSOR = "embedding.weight"
MAX_INPUT_CHARS = 32_000
"""Longer inputs are cut: a mean over that many characters says all it can."""


class EmbeddingModelMissing(RuntimeError):
    """The package that ships the embedding model is not installed (or lacks its files)."""


@dataclass(frozen=True)
class EmbeddingFiles:
    weights: Path
    tokenizer: Path


def find_files() -> EmbeddingFiles:
    """The packaged model's files, located without importing the package."""
    for module in (PACKAGE, "safetensors", "tokenizers", "numpy"):
        if importlib.util.find_spec(module) is None:
            raise EmbeddingModelMissing(f"{module} is not installed (the `local` extra)")
    spec = importlib.util.find_spec(PACKAGE)
    roots = [Path(p) for p in (spec.submodule_search_locations or ())] if spec else []
    roots += [Path(entry or ".") / PACKAGE for entry in sys.path]
    for root in roots:
        files = EmbeddingFiles(root / WEIGHTS, root / TOKENIZER)
        if files.weights.is_file() and files.tokenizer.is_file():
            return files
    raise EmbeddingModelMissing(f"the {PACKAGE} package has no {WEIGHTS} and {TOKENIZER}")


def missing() -> str | None:
    """Why the local embedding model cannot load here, or None when it can."""
    try:
        find_files()
    except EmbeddingModelMissing as exc:
        return str(exc)
    return None


class Encoder:
    """Texts → unit vectors of EMBEDDING_DIMENSIONS floats. Thread-safe (read-only)."""

    def __init__(self, files: EmbeddingFiles | None = None):
        import numpy as np
        from safetensors import safe_open
        from tokenizers import Tokenizer
        files = files or find_files()
        with safe_open(str(files.weights), framework="np") as f:
            self._table = np.ascontiguousarray(f.get_tensor(TENSOR), dtype=np.float32)
        self._tokenizer = Tokenizer.from_file(str(files.tokenizer))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._np = np

    @property
    def dimensions(self) -> int:
        return int(self._table.shape[1])

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        np = self._np
        out = []
        for encoding in self._tokenizer.encode_batch([t[:MAX_INPUT_CHARS] for t in texts],
                                                     add_special_tokens=False):
            ids = encoding.ids
            if not ids:
                out.append([0.0] * self.dimensions)
                continue
            rows = np.clip(np.asarray(ids, dtype=np.int64), 0, self._table.shape[0] - 1)
            vector = self._table[rows].mean(axis=0)
            norm = float(np.linalg.norm(vector))
            out.append([float(v) for v in (vector / norm if norm else vector)])
        return out


def token_count(text: str) -> int:
    """About how many tokens a text is, for the usage a response reports."""
    return math.ceil(len(text) / 4)
