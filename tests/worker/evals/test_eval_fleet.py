"""``fermix eval`` through real parts: a uvicorn gateway, two real ``celery worker`` processes,
Redis, and the scripted model reached through the official OpenAI SDK.

A suite of passing and failing cases (contains, not contains, regex, a JSON schema, a tool
called with an argument matcher and one not called, max steps, a model-graded rubric each
way, a prior history and two user messages, a second model) runs on the fleet; the table,
the exit code, the JSON report and the JUnit XML (parsed) say which passed and why. A case
repeated three times reports its pass rate. A real turn made a case with ``--from-run`` runs
as a suite of its own and passes.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from fermix_shared.evals.from_run import REFERENCE_RUBRIC
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import uniq, wait


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path) -> Iterator[Stack]:
    # No memory review while the tests run: its call quotes a turn, and would take a reply
    # scripted for the turn's text.
    env = {**provider_env(llm, "openai"), "FERMIX_USAGE__ENABLED": "true",
           "FERMIX_MEMORY_REVIEW_QUIET_SECONDS": "3600"}
    s = start_stack("eval", redis_url, 10, env, logs_dir, workers=2)
    yield s
    s.stop()


def _requests_with(llm: ScriptedLLMServer, text: str) -> list[dict]:
    return [r for r in llm.script.requests if text in json.dumps(r["body"])]


def test_a_suite_of_passing_and_failing_cases_runs_on_the_fleet_and_reports_each_way(
    stack: Stack, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    mul, hello, sorry, js, ada1, ada2, rub = (
        uniq(p) for p in ("mul", "hello", "sorry", "json", "ada", "ada", "rubric"))
    good_rubric, bad_rubric = f"GOOD-{rub}: states the product", f"BAD-{rub}: names a prime"
    # A grader's prompt quotes its case's messages: its replies come first, so a case's own
    # replies never answer another run's grader.
    llm.script.push(
        Reply(match=good_rubric, text="**PASS** — it gives 42."),
        Reply(match=bad_rubric, text="FAIL\nIt names no prime."),
        Reply(match=mul, tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(match=mul, text="6*7 is 42."),
        Reply(match=hello, text="Hello there!"),  # "greets" runs on two models
        Reply(match=hello, text="Hello there!"),
        Reply(match=sorry, text="Sorry, I cannot help with that."),
        Reply(match=js, text='```json\n{"answer": "forty-two"}\n```'),
        Reply(match=ada1, text="Noted."),
        Reply(match=ada2, text="Your name is Ada."),
    )
    suite = tmp_path / "smoke.toml"
    suite.write_text(f'''
[suite]
name = "smoke"

[[case]]
name = "multiplies"
message = "{mul}"
[case.expect]
contains = "42"
regex = ['\\b42\\b']
tool_called = [{{name = "calculator", args = {{expression = {{regex = '6\\s*\\*\\s*7'}}}}}}]
tool_not_called = ["run_command"]
max_steps = 2
max_cost_usd = 1.0
max_latency_s = 60
rubric = "{good_rubric}"

[[case]]
name = "greets"
message = "{hello}"
models = ["scripted-openai", "openai/scripted-b"]
expect = {{contains = "Hello", max_steps = 1}}

[[case]]
name = "no apologies"
message = "{sorry}"
[case.expect]
not_contains = ["Sorry"]
tool_not_called = "calculator"

[[case]]
name = "answers in json"
message = "{js}"
[case.expect]
json_schema = {{type = "object", required = ["answer"], properties = {{answer = {{type = "integer"}}}}}}

[[case]]
name = "remembers a name"
messages = ["{ada1}", "{ada2}"]
history = [{{role = "user", content = "My name is Ada."}}, {{role = "assistant", content = "Hello, Ada!"}}]
[case.expect]
contains = "Ada"
max_steps = 2
rubric = "{bad_rubric}"
''', encoding="utf-8")
    out = stack.fermix("eval", str(suite), "--json", "report.json", "--junit", "junit.xml",
                 cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr  # three cases fail
    table = out.stdout
    assert "Suite smoke: 5 cases × 3 columns, 6 runs" in table
    assert "3 of 6 runs passed; 3 of 6 cells below the pass rate 100%." in table, table
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["multiplies"].count("PASS") == 1 and lines["greets"].count("PASS") == 2, table
    assert "FAIL" in lines["no apologies"] and "FAIL" in lines["answers in json"]
    assert "    - reply contains 'Sorry'" in table
    assert "    - reply does not fit the schema at answer: 'forty-two' is not of type " \
           "'integer'" in table
    assert "    - the rubric failed: It names no prime." in table
    # Each run ended on stderr as it came.
    assert "PASS    greets [default @ openai/scripted-b] #1" in out.stderr

    # The second model was asked, through its own route; the history reached the model with
    # the second message after the first one's answer.
    assert sorted(r["body"]["model"] for r in _requests_with(llm, hello)) == [
        "scripted-b", "scripted-openai"]
    (second,) = [r for r in _requests_with(llm, ada2) if bad_rubric not in json.dumps(r["body"])]
    said = [(m["role"], m.get("content")) for m in second["body"]["messages"]
            if m["role"] in ("user", "assistant")]
    assert said[:2] == [("user", "My name is Ada."), ("assistant", "Hello, Ada!")]
    assert said[-3:] == [("user", ada1), ("assistant", "Noted."), ("user", ada2)]

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] is False and report["suite"] == "smoke"
    runs = {(r["case"], r["model"]): r for r in report["runs"]}
    mul_run = runs[("multiplies", None)]
    assert mul_run["toolCalls"] == [{"name": "calculator", "arguments": {"expression": "6*7"}}]
    assert mul_run["steps"] == 2 and mul_run["reply"] == "6*7 is 42."
    assert mul_run["grade"] == {"passed": True, "reason": "it gives 42.",
                                "model": "openai/scripted-openai"}
    assert runs[("greets", "openai/scripted-b")]["route"] == "openai/scripted-b"
    assert runs[("remembers a name", None)]["failures"] == ["the rubric failed: It names no prime."]

    # JUnit XML, parsed: one testcase per run, a failure element for each failed one.
    root = ET.parse(tmp_path / "junit.xml").getroot()
    (ts,) = root.findall("testsuite")
    assert (ts.get("name"), ts.get("tests"), ts.get("failures"), ts.get("errors")) == \
        ("smoke", "6", "3", "0")
    cases = {tc.get("name"): tc for tc in ts.findall("testcase")}
    assert set(cases) == {"multiplies [default]", "greets [default @ scripted-openai]",
                          "greets [default @ openai/scripted-b]", "no apologies [default]",
                          "answers in json [default]", "remembers a name [default]"}
    failure = cases["no apologies [default]"].find("failure")
    assert failure is not None and failure.get("message") == "reply contains 'Sorry'"
    assert cases["multiplies [default]"].find("failure") is None
    assert cases["multiplies [default]"].findtext("system-out") == "6*7 is 42."


def test_repeat_reports_a_pass_rate_and_the_rate_decides_the_exit(
    stack: Stack, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    text = uniq("flaky")
    llm.script.push(Reply(match=text, text="42"), Reply(match=text, text="42"),
                    Reply(match=text, text="I do not know."))
    suite = tmp_path / "flaky.yaml"
    suite.write_text(f"cases:\n  - name: flaky\n    message: {text}\n    expect:\n"
                     f"      contains: '42'\n", encoding="utf-8")
    out = stack.fermix("eval", str(suite), "--repeat", "3", "--min-pass-rate", "60%",
                 "--junit", "j.xml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr  # 2 of 3 is over 60%
    assert "2/3 67%" in out.stdout and "2 of 3 runs passed; every cell at or above 60%." \
        in out.stdout
    ts = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert ts is not None and (ts.get("tests"), ts.get("failures")) == ("3", "1")
    assert sorted(tc.get("name") for tc in ts.findall("testcase")) == [
        "flaky [default] #1", "flaky [default] #2", "flaky [default] #3"]


def test_a_real_run_becomes_a_case_that_runs_as_a_suite(
    stack: Stack, llm: ScriptedLLMServer, tmp_path: Path
) -> None:
    text = uniq("prod")
    llm.script.push(
        Reply(match=text, tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(match=text, text="It is 42."),
    )
    with stack.http() as http:
        resp = http.post("/v1/agent", json={"message": text, "chatId": uniq("chat")})
        assert resp.status_code == 202, resp.text
        run = wait(http, resp.json()["runId"])
    assert run["status"] == "ok", run
    made = stack.fermix("eval", "--from-run", run["runId"], "--out", "case.toml", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    case = (tmp_path / "case.toml").read_text()
    assert f'name = "from {run["runId"]}"' in case and 'reference = "It is 42."' in case
    assert 'tool_called = [\n    "calculator",\n]' in case or \
        'tool_called = ["calculator"]' in case, case
    # The case, run again: the same answer (scripted), graded against its reference.
    llm.script.push(
        Reply(match=text, tool_calls=[ToolCallSpec("calculator", {"expression": "6*7"})]),
        Reply(match=text, text="It is 42."),
        Reply(match=REFERENCE_RUBRIC[:50], text="PASS\nThe same as the reference."),
    )
    out = stack.fermix("eval", "case.toml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 of 1 runs passed" in out.stdout
    grader = _requests_with(llm, REFERENCE_RUBRIC[:50])[-1]
    assert "A reference reply, known to be good:\\nIt is 42." in json.dumps(grader["body"])
    # A run without a record is refused with the gateway's sentence.
    missing = stack.fermix("eval", "--from-run", "run_nope", cwd=tmp_path)
    assert missing.returncode == 1 and "run run_nope has no record" in missing.stderr


def test_a_bad_case_or_agent_is_a_422_with_the_reason(stack: Stack) -> None:
    with stack.http() as http:
        bad = http.post("/v1/evals/run", json={"case": {"name": "c", "message": "m",
                                                         "expect": {"max_steps": 0}}})
        assert bad.status_code == 422
        assert bad.json() == {"error": "case 'c': expect.max_steps: Input should be greater "
                                       "than or equal to 1"}
        unknown = http.post("/v1/evals/run", json={"case": {"name": "c", "message": "m"},
                                                   "agent": "nobody"}, timeout=60)
        assert unknown.status_code == 422 and unknown.json() == {
            "error": "no agent is named 'nobody'"}
        model = http.post("/v1/evals/run", json={"case": {"name": "c", "message": "m"},
                                                 "model": "mistral/large"}, timeout=60)
        assert model.status_code == 422 and "is not 'anthropic/...', 'openai/...'" in \
            model.json()["error"]
