"""parse_action: exactly one well-formed <action>...</action>, tolerant of tag case/whitespace."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orsd.envs import parse_action
from orsd.envs.actions import format_answer


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>find shoes</think><action>search[red shoes]</action>", "search[red shoes]"),
        ("<action>go to fridge 1</action>", "go to fridge 1"),  # no think block is fine
        ("<think>x</think>\n<action>  click[Buy Now]  </action>\n", "click[Buy Now]"),
        ("<THINK>x</THINK><ACTION>look</ACTION>", "look"),
        ("< action >look</ action >", "look"),
        ("<Action>open\n  drawer   1</aCtIoN>", "open drawer 1"),  # inner whitespace collapsed
        ("<action>Click[B0ABC12345]</action>", "Click[B0ABC12345]"),  # case of command kept
        ("<action>click[< Prev]</action>", "click[< Prev]"),  # angle brackets inside are fine
        ("<action>click[Next >]</action> trailing words", "click[Next >]"),
    ],
)
def test_parse_action_accepts(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "search[red shoes]",  # no tags
        "<think>only thinking</think>",
        "<action></action>",  # empty
        "<action>   \n </action>",  # blank
        "<action>look",  # unclosed
        "look</action>",  # no opening tag
        "</action>look<action>",  # closing before opening
        "<action>look</action><action>inventory</action>",  # two actions
        "<action>look<action>inventory</action>",  # two openings
        "<action>look</action></action>",  # two closings
        "<think><action>a</action></think><action>b</action>",  # action inside think counts
    ],
)
def test_parse_action_rejects(text):
    assert parse_action(text) is None


def test_parse_action_type_error():
    with pytest.raises(TypeError, match="text must be a str"):
        parse_action(None)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_action_never_raises_on_text(text):
    result = parse_action(text)
    assert result is None or (result and result == result.strip())


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1).map(lambda s: " ".join(s.split())).filter(
    lambda s: s and "action" not in s.lower()))
def test_format_answer_round_trips(command):
    assert parse_action(format_answer(command, "thinking")) == command


def test_format_answer_exact_text_and_errors():
    assert format_answer("look", " why not ") == "<think>why not</think><action>look</action>"
    with pytest.raises(ValueError, match="does not survive"):
        format_answer(" look")
    with pytest.raises(ValueError, match="does not survive"):
        format_answer("")
    with pytest.raises(ValueError, match="thought must not contain"):
        format_answer("look", "<action>x</action>")
    with pytest.raises(TypeError):
        format_answer(None)
