"""The completions request's prompt field: token ids are tried first and strictly (a fast path; pydantic's smart union
tries every member), and every input is taken, or refused, as the smart union over the OpenAI forms takes it."""

from __future__ import annotations

import json

import pytest

pydantic = pytest.importorskip("pydantic")

from models.server.protocol import CompletionRequest  # noqa: E402

CASES = ["abc", "", ["a", "b"], ["1", "2"], [1, 2], list(range(512)), [[1, 2], [3]], [1.0, 2.0], [], [True], [1, "a"],
         [[1], 2], 5, None, [1.5], [["a"]], {"a": 1}]  # fmt: skip


@pytest.mark.parametrize("mode", ["json", "python"])
@pytest.mark.parametrize("prompt", CASES, ids=[repr(c)[:20] for c in CASES])
def test_the_prompt_is_read_as_the_smart_union_reads_it(prompt, mode):
    """In JSON mode (the server parses a body with ``model_validate_json``) and from Python objects."""
    smart = pydantic.TypeAdapter(str | list[str] | list[int] | list[list[int]])  # the four forms, pydantic's default
    if mode == "json":
        def ours():
            return CompletionRequest.model_validate_json(json.dumps({"prompt": prompt}))

        def theirs():
            return smart.validate_json(json.dumps(prompt))
    else:
        def ours():
            return CompletionRequest(prompt=prompt)

        def theirs():
            return smart.validate_python(prompt)
    try:
        want = theirs()
    except pydantic.ValidationError:
        with pytest.raises(pydantic.ValidationError):
            ours()
        return
    got = ours().prompt
    assert got == want and type(got) is type(want)
    assert all(type(a) is type(b) for a, b in zip(got, want, strict=True)) if isinstance(got, list) else True
