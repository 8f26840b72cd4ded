import pytest

from agentq.llm.names import API_NAME_MAX_CHARS, NameMap, from_api_name, is_api_name, to_api_name


@pytest.mark.parametrize("ours, api", [
    ("math.evaluate", "math-evaluate"),
    ("files.read_file", "files-read_file"),
    ("a.b", "a-b"),
    ("code.run2", "code-run2"),
])
def test_our_names_round_trip(ours, api):
    assert to_api_name(ours) == api
    assert from_api_name(api) == ours
    names = NameMap([ours])
    assert names.api(ours) == api
    assert names.ours(api) == ours


@pytest.mark.parametrize("name, api", [
    ("already_valid-Name9", "already_valid-Name9"),
    ("has space", "has_space"),
    ("Math.Evaluate", "Math_Evaluate"),  # not one of our names: '.' is just invalid
    ("a.b.c", "a_b_c"),
    ("naïve/tool", "na_ve_tool"),
    ("", "_"),
])
def test_other_strings_become_valid(name, api):
    assert to_api_name(name) == api
    assert is_api_name(to_api_name(name))


def test_long_names_are_shortened_with_a_stable_hash():
    long_a = "m." + "a" * 100
    long_b = "m." + "a" * 99 + "b"
    api_a, api_b = to_api_name(long_a), to_api_name(long_b)
    assert len(api_a) == len(api_b) == API_NAME_MAX_CHARS
    assert is_api_name(api_a) and is_api_name(api_b)
    assert api_a != api_b
    assert api_a == to_api_name(long_a)  # stable
    assert api_a.startswith("m-aaaa")
    names = NameMap([long_a, long_b])
    assert names.ours(names.api(long_a)) == long_a
    assert names.ours(names.api(long_b)) == long_b


def test_exactly_64_chars_is_kept():
    name = "x" * 64
    assert to_api_name(name) == name


def test_collisions_get_distinct_names_whatever_the_order():
    colliding = ["math.evaluate", "math-evaluate", "math evaluate", "math/evaluate"]
    first = NameMap(colliding)
    second = NameMap(reversed(colliding))
    apis = [first.api(n) for n in colliding]
    assert len(set(apis)) == len(colliding)
    assert all(is_api_name(a) for a in apis)
    assert apis == [second.api(n) for n in colliding]  # deterministic
    assert first.api("math.evaluate") == "math-evaluate"  # our name keeps the plain one
    for name in colliding:
        assert first.ours(first.api(name)) == name


def test_a_suffixed_name_never_takes_another_names_plain_name():
    names = NameMap(["a b", "a_b", "a_b_" + "0" * 10])
    apis = {names.api(n) for n in ["a b", "a_b", "a_b_" + "0" * 10]}
    assert len(apis) == 3


def test_unknown_api_names():
    names = NameMap(["math.evaluate"])
    assert names.ours("files-read") == "files.read"  # the reversible rule
    assert names.ours("Not-Ours") == "Not-Ours"
    assert names.ours("weird_name") == "weird_name"
    assert names.ours("a-b-c") == "a-b-c"
    assert names.api("files.read") == "files-read"  # outside the map: the plain rule


def test_len_and_contains():
    names = NameMap(["math.evaluate", "math.evaluate", "time.now"])
    assert len(names) == 2
    assert "time.now" in names and "time.later" not in names
