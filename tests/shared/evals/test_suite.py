"""Suite files read (TOML and YAML), refused with a sentence naming the file, case and key,
and each expectation checked against a run: one sentence per failed expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from fermix_cli.main import main
from fermix_shared.evals.expect import CalledTool, Observed, check
from fermix_shared.evals.suite import Expect, SuiteError, load, parse

TOML = '''
[suite]
name = "support"
agents = ["default", "helper"]
models = ["openai/a", "b"]

[[case]]
name = "one"
message = "hi"

[[case]]
name = "two"
messages = ["a", "b"]
agents = "default"
models = []
[case.expect]
contains = "x"
'''


def test_a_toml_suite_expands_to_case_agent_model_and_repeat(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML)
    suite = load(path)
    assert suite.name == "support" and [c.name for c in suite.cases] == ["one", "two"]
    labels = [(t.case.name, t.label, t.repeat) for t in suite.targets(repeat=2)]
    assert labels[:4] == [("one", "default @ openai/a", 1), ("one", "default @ openai/a", 2),
                          ("one", "default @ b", 1), ("one", "default @ b", 2)]
    assert len(labels) == 2 * 2 * 2 + 1 * 2 * 2  # "two": its own agent, the suite's models
    assert suite.cases[1].expect.contains == ["x"]


def test_a_yaml_suite_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("suite: {name: y}\ncases:\n  - name: one\n    message: hi\n"
                    "    expect: {tool_called: [calculator], max_steps: 2}\n")
    suite = load(path)
    assert suite.name == "y" and suite.cases[0].expect.tool_called[0].name == "calculator"
    assert [t.label for t in suite.targets()] == ["default"]


@pytest.mark.parametrize(("text", "sentence"), [
    ('[[case]]\nname = "a"\n', "s.toml: case 'a': messages: Field required"),
    ('[[case]]\nname = "a"\nmessage = "m"\n[case.expect]\nregex = "("\n',
     "s.toml: case 'a': expect.regex: '(' is not a regex (missing ), unterminated subpattern"),
    ('[[case]]\nname = "a"\nmessage = "m"\n[case.expect]\ncontain = "x"\n',
     "s.toml: case 'a': expect.contain: Extra inputs are not permitted"),
    ('[[case]]\nname = "a"\nmessage = "m"\n[case.expect]\njson_schema = {type = 5}\n',
     "s.toml: case 'a': expect.json_schema: not a JSON schema: 5 is not valid"),
    ('[[case]]\nname = "a"\nmessage = "m"\n[[case]]\nname = "a"\nmessage = "n"\n',
     "s.toml: two cases are named 'a'"),
    ('[suite]\nname = "x"\n', "s.toml: the suite has no [[case]]"),
    ('[[case]]\nname = "a"\nmessage = "  "\n', "s.toml: case 'a': messages: a message is empty"),
    ("[[case]\n", "s.toml is not valid TOML: "),
])
def test_a_bad_suite_is_refused_with_where_and_why(tmp_path: Path, text: str,
                                                   sentence: str) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(SuiteError) as e:
        load(path)
    assert str(e.value).removeprefix(str(tmp_path) + "/").startswith(sentence), str(e.value)


def test_the_cli_exits_2_with_the_sentence(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json5"
    path.write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["eval", str(path)])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"fermix: {path}: a suite is a .toml, .yaml or .yml file\n"
    with pytest.raises(SystemExit) as e:
        main(["eval", str(tmp_path / "missing.toml")])
    assert e.value.code == 2 and "cannot read the suite" in capsys.readouterr().err


def _expect(**kw: object) -> Expect:
    return parse({"cases": [{"name": "c", "message": "m", "expect": kw}]}, "t").cases[0].expect


def test_every_expectation_fails_with_its_own_sentence() -> None:
    seen = Observed(reply="Sorry, 41.", tool_calls=[CalledTool("calculator", {"expression": "6*8"}),
                                                    CalledTool("run_command", {"cmd": "ls"})],
                    steps=4, usd=0.02, latency_s=3.5)
    expect = _expect(contains=["42"], not_contains="Sorry", regex=r"\b42\b",
                     json_schema={"type": "object"},
                     tool_called=[{"name": "calculator",
                                   "args": {"expression": {"regex": r"6\s*\*\s*7"}}},
                                  "web_fetch"],
                     tool_not_called=["run_command"], max_steps=3, max_cost_usd=0.01,
                     max_latency_s=2)
    assert check(expect, seen) == [
        "reply does not contain '42'",
        "reply contains 'Sorry'",
        r"reply does not match /\b42\b/",
        "reply is not JSON: 'Sorry, 41.'",
        'calculator was called, but never with arguments matching {"expression": {"regex": '
        '"6\\\\s*\\\\*\\\\s*7"}} (first: {"expression": "6*8"})',
        "web_fetch was not called",
        "run_command was called (expected not)",
        "4 steps (at most 3)",
        "cost $0.020000 (at most $0.01)",
        "took 3.50 s (at most 2 s)",
    ]


def test_a_run_that_meets_them_passes_and_matchers_match() -> None:
    seen = Observed(reply='```json\n{"answer": 42}\n```',
                    tool_calls=[CalledTool("calculator", {"expression": "6 * 7", "n": 3})],
                    steps=2)
    expect = _expect(contains="42", json_schema={"type": "object", "required": ["answer"]},
                     tool_called=[{"name": "calculator", "args": {
                         "expression": {"contains": "*"}, "n": 3}},
                         {"name": "calculator", "args": {"n": {"equals": 3}}}],
                     tool_not_called="web_fetch", max_steps=2)
    assert check(expect, seen) == []


def test_an_errored_run_fails_before_its_reply_is_read() -> None:
    seen = Observed(reply="", ok=False, error="Budget exceeded.")
    assert check(_expect(not_contains="x", max_steps=5), seen) == [
        "the run ended in an error: Budget exceeded."]
