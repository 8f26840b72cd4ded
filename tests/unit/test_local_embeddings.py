"""The packaged embedding model (`agentq.local_embeddings`) and the local server's
/v1/embeddings route, without llama.cpp running. They need the `local` extra: skipped
without it, and on CI (`CI` set) that fails instead."""
from __future__ import annotations

import base64
import importlib.util
import math
import os
import struct

import pytest

from agentq import local_embeddings
from agentq.local_embeddings import EMBEDDING_DIMENSIONS, EMBEDDING_MODEL, Encoder


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    reason = local_embeddings.missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the local embedding model is missing: {reason}", pytrace=False)
        pytest.skip(reason)
    return Encoder()


FACTS = {
    "What colour do I like best?": "My favourite colour is teal.",
    "What is my pet's name?": "My dog is called Biscuit.",
    "Which food should I avoid?": "I am allergic to peanuts.",
    "When is my sister's birthday?": "My sister's birthday is on March 3rd.",
    "What is my job?": "I work as a nurse at the city hospital.",
    "When is the project due?": "The project deadline is next Friday.",
    "What do I drink in the morning?": "I prefer tea over coffee in the morning.",
}


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_a_question_finds_its_fact_among_unrelated_ones(encoder):
    # given facts about a user, embedded
    facts = list(FACTS.values())
    vectors = encoder.embed(facts)
    # when each question is embedded, then the fact that answers it is the most similar
    for question, vector in zip(FACTS, encoder.embed(list(FACTS)), strict=True):
        scores = [cosine(vector, v) for v in vectors]
        assert facts[scores.index(max(scores))] == FACTS[question], (question, scores)


def test_vectors_are_unit_length_and_empty_text_is_zero(encoder):
    vector, empty = encoder.embed(["My dog is called Biscuit.", ""])
    assert len(vector) == EMBEDDING_DIMENSIONS == encoder.dimensions
    assert math.isclose(math.sqrt(cosine(vector, vector)), 1.0, rel_tol=1e-5)
    assert empty == [0.0] * EMBEDDING_DIMENSIONS


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                    reason="fastapi (llama-cpp-python[server]) is not installed")
def test_the_route_answers_as_the_openai_api_does(encoder):
    from fastapi import APIRouter, FastAPI
    from fastapi.testclient import TestClient

    from agentq.local_server import install_embeddings
    # given an app with a /v1/embeddings of its own, as llama.cpp's server has
    router = APIRouter()
    router.post("/v1/embeddings")(lambda: {"from": "llama.cpp"})
    app = FastAPI()
    app.include_router(router)
    assert install_embeddings(app)
    with TestClient(app) as client:
        # then ours answers: a vector per input, floats or base64, with usage
        body = client.post("/v1/embeddings", json={"input": ["a dog", "tea"],
                                                   "model": EMBEDDING_MODEL}).json()
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert body["data"][0]["embedding"] == pytest.approx(encoder.embed(["a dog"])[0])
        assert body["model"] == EMBEDDING_MODEL and body["usage"]["prompt_tokens"] > 0
        packed = client.post("/v1/embeddings", json={"input": "a dog",
                                                     "encoding_format": "base64"}).json()
        raw = base64.b64decode(packed["data"][0]["embedding"])
        assert list(struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", raw)) == pytest.approx(
            body["data"][0]["embedding"], abs=1e-6)
        # and a malformed request is a 400 in the API's error shape
        bad = client.post("/v1/embeddings", json={"input": 5})
        assert bad.status_code == 400 and "input" in bad.json()["error"]["message"]
