"""The workspace file tools as the model calls them, with a turn's context: confinement to the
turn's root (``..``, absolute paths, symlinks out), per-agent and per-conversation roots, the
edit rules, bounded reads, listings and searches, and who is offered what."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fermix_shared.messages import ToolCall
from fermix_shared.models import ConversationKey, InboundMessage, Trust
from fermix_shared.settings import Settings
from fermix_worker.tools import GUEST, OPERATOR, ToolError, ToolRegistry, ToolResult
from fermix_worker.tools.context import RunContext, SubagentContext
from fermix_worker.tools.files import file_tools
from fermix_worker.tools.files.limits import READ_MAX_CHARS
from fermix_worker.tools.files.listing import glob_regex
from fermix_worker.tools.workspace import READ_ONLY, Workspace, conversation_dir

CHAT = ConversationKey(channel="telegram", chat_id="42")


def settings_for(root: Path | None, **extra: Any) -> Settings:
    return Settings(redis_url="redis://unused", workspace=root, **extra)


def call(settings: Settings, name: str, *, key: ConversationKey = CHAT, agent: str = "default",
         trust: Trust = "operator", deliver_to: ConversationKey | None = None,
         **args: Any) -> ToolResult:
    registry = ToolRegistry(file_tools(settings)).scoped(OPERATOR if trust == "operator" else GUEST)
    msg = InboundMessage(key=key, text="-", trust=trust, agent=agent, deliver_to=deliver_to)
    return registry.execute(ToolCall(id="c", name=name, arguments=args),
                            RunContext.for_turn(msg))


def ok(result: ToolResult) -> str:
    assert not result.is_error, result.content
    return result.content


def error(result: ToolResult) -> str:
    assert result.is_error, result.content
    return result.content


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def s(root: Path) -> Settings:
    return settings_for(root)


def test_no_workspace_configured_offers_no_file_tools() -> None:
    assert file_tools(settings_for(None)) == []
    per_agent = settings_for(None, agents=[{"name": "coder", "workspace": "/srv/coder"}])
    assert len(file_tools(per_agent)) == 5


def test_guests_get_only_the_read_only_tools(s: Settings) -> None:
    registry = ToolRegistry(file_tools(s))
    assert sorted(t.name for t in registry.scoped(GUEST).specs()) == [
        "list_files", "read_file", "search_files"]
    assert len(registry.scoped(OPERATOR).specs()) == 5
    assert "needs read_write access" in error(
        call(s, "write_file", trust="guest", path="a.txt", content="x"))


def test_write_creates_parents_then_read_and_edit(s: Settings, root: Path) -> None:
    assert ok(call(s, "write_file", path="src/pkg/app.py", content="x = 1\ny = 2\n")) == (
        "created src/pkg/app.py (12 bytes)")
    assert (root / "src/pkg/app.py").read_text() == "x = 1\ny = 2\n"
    assert ok(call(s, "read_file", path="src/pkg/app.py")) == "x = 1\ny = 2\n"
    assert ok(call(s, "edit_file", path="src/pkg/app.py", old_string="y = 2",
                   new_string="y = 3")) == "replaced 1 occurrence in src/pkg/app.py"
    assert ok(call(s, "write_file", path="src/pkg/app.py", content="z\n")).startswith("replaced")
    assert (root / "src/pkg/app.py").read_text() == "z\n"


def test_edit_needs_exactly_one_match_unless_replace_all(s: Settings, root: Path) -> None:
    (root / "f.txt").write_text("a-b\na-b\n")
    assert "was not found in f.txt" in error(
        call(s, "edit_file", path="f.txt", old_string="c", new_string="d"))
    assert "occurs 2 times in f.txt" in error(
        call(s, "edit_file", path="f.txt", old_string="a-b", new_string="x"))
    assert (root / "f.txt").read_text() == "a-b\na-b\n"
    assert ok(call(s, "edit_file", path="f.txt", old_string="a-b", new_string="x",
                   replace_all=True)) == "replaced 2 occurrences in f.txt"
    assert (root / "f.txt").read_text() == "x\nx\n"
    assert "the same" in error(call(s, "edit_file", path="f.txt", old_string="x", new_string="x"))


def test_read_pages_a_big_file_by_offset_and_limit(s: Settings, root: Path) -> None:
    (root / "big.txt").write_text("".join(f"line {i}\n" for i in range(1, 5001)))
    first = ok(call(s, "read_file", path="big.txt", limit=3))
    assert first == "line 1\nline 2\nline 3\n\n[lines 1-3 of big.txt; more follow: read on with offset=4]"
    assert ok(call(s, "read_file", path="big.txt", offset=4999)) == "line 4999\nline 5000\n"
    default = ok(call(s, "read_file", path="big.txt"))
    assert default.endswith("read on with offset=1001]")
    assert "past the end" in ok(call(s, "read_file", path="big.txt", offset=9000))
    (root / "wide.txt").write_text(("x" * 1500 + "\n") * 100)
    wide = ok(call(s, "read_file", path="wide.txt"))
    assert len(wide) <= READ_MAX_CHARS + 200 and "more follow" in wide


def test_binaries_fifos_and_folders_are_not_read(s: Settings, root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\x7fELF\0\0\x01")
    assert "binary file" in error(call(s, "read_file", path="blob.bin"))
    os.mkfifo(root / "pipe")
    assert "not a regular file" in error(call(s, "read_file", path="pipe"))
    assert "is a directory" in error(call(s, "read_file", path="."))
    assert "does not exist" in error(call(s, "read_file", path="nope.txt"))


@pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "/etc/passwd",
                                  "link_out/secret.txt", "file_link"])
def test_paths_outside_the_root_are_refused(s: Settings, root: Path, tmp_path: Path,
                                            path: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    (tmp_path / "outside.txt").write_text("s3cret")
    (root / "link_out").symlink_to(outside)
    (root / "file_link").symlink_to(outside / "secret.txt")
    for name, args in [("read_file", {}), ("write_file", {"content": "pwned"}),
                       ("edit_file", {"old_string": "s3cret", "new_string": "pwned"})]:
        assert "outside the workspace" in error(call(s, name, path=path, **args))
    assert (outside / "secret.txt").read_text() == "s3cret"
    assert (tmp_path / "outside.txt").read_text() == "s3cret"


def test_writing_through_a_dangling_symlink_out_is_refused(s: Settings, root: Path,
                                                           tmp_path: Path) -> None:
    (root / "new.txt").symlink_to(tmp_path / "created-outside.txt")
    assert "outside the workspace" in error(call(s, "write_file", path="new.txt", content="x"))
    assert not (tmp_path / "created-outside.txt").exists()


def test_a_symlink_that_appears_after_the_check_is_not_followed(root: Path,
                                                                tmp_path: Path) -> None:
    # A command in the same workspace swaps a folder for a link out between resolve and open.
    (root / "sub").mkdir()
    ws = Workspace(root)
    path = ws.resolve("sub/f.txt")
    (root / "sub").rmdir()
    (root / "sub").symlink_to(tmp_path)
    with pytest.raises(ToolError, match="changed while in use"):
        ws.open(path, os.O_WRONLY | os.O_CREAT, make_parents=True)
    assert not (tmp_path / "f.txt").exists()

def test_symlinks_and_absolute_paths_inside_the_root_are_fine(s: Settings, root: Path) -> None:
    (root / "real.txt").write_text("hello\n")
    (root / "alias.txt").symlink_to(root / "real.txt")
    assert ok(call(s, "read_file", path="alias.txt")) == "hello\n"
    assert ok(call(s, "read_file", path=str(root / "real.txt"))) == "hello\n"
    ok(call(s, "edit_file", path="alias.txt", old_string="hello", new_string="bye"))
    assert (root / "real.txt").read_text() == "bye\n"


def test_each_agent_works_in_its_own_root(tmp_path: Path) -> None:
    shared, coder = tmp_path / "shared", tmp_path / "coder"
    s = settings_for(shared, agents=[{"name": "coder", "workspace": str(coder)}])
    ok(call(s, "write_file", agent="coder", path="mine.txt", content="c"))
    ok(call(s, "write_file", path="theirs.txt", content="d"))
    assert (coder / "mine.txt").exists() and (shared / "theirs.txt").exists()
    assert ok(call(s, "list_files", agent="coder")) == "mine.txt (1 bytes)"


def test_an_agent_without_a_workspace_gets_a_clear_error(tmp_path: Path) -> None:
    s = settings_for(None, agents=[{"name": "coder", "workspace": str(tmp_path / "c")}])
    assert "agent 'default' has no workspace" in error(call(s, "list_files"))


def test_conversations_do_not_see_each_other_s_files(root: Path) -> None:
    s = settings_for(root, workspace_per_conversation=True)
    other = ConversationKey(channel="slack", chat_id="C1", thread_scope="17.5")
    ok(call(s, "write_file", path="notes.md", content="mine"))
    assert "does not exist" in error(call(s, "read_file", key=other, path="notes.md"))
    assert "outside the workspace" in error(
        call(s, "read_file", key=other, path=f"../{conversation_dir(CHAT)}/notes.md"))
    assert (root / conversation_dir(CHAT) / "notes.md").read_text() == "mine"
    assert conversation_dir(other).startswith("slack-C1-17.5-")
    assert conversation_dir(ConversationKey(channel="http", chat_id="../..")).startswith("http-.._..-")


def test_a_scheduled_run_uses_its_delivery_chat_s_folder_or_its_job_s(root: Path) -> None:
    s = settings_for(root, workspace_per_conversation=True)
    run_1 = ConversationKey(channel="schedule", chat_id="digest", thread_scope="run_1")
    run_2 = ConversationKey(channel="schedule", chat_id="digest", thread_scope="run_2")
    ok(call(s, "write_file", path="notes.md", content="mine"))
    assert ok(call(s, "read_file", key=run_1, deliver_to=CHAT, path="notes.md")) == "mine"
    ok(call(s, "write_file", key=run_1, path="state.json", content="{}"))
    assert ok(call(s, "read_file", key=run_2, path="state.json")) == "{}"

def test_list_files_globs_relative_to_the_root(s: Settings, root: Path, tmp_path: Path) -> None:
    for rel in ["a.py", "src/b.py", "src/deep/c.py", "src/d.txt", ".git/objects/e.py",
                "node_modules/x/f.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    (root / "out").symlink_to(tmp_path)
    assert ok(call(s, "list_files")).split("\n") == [
        ".git/", "a.py (1 bytes)", "node_modules/", "src/"]
    assert ok(call(s, "list_files", pattern="**/*.py")).split("\n") == [
        "a.py (1 bytes)", "src/b.py (1 bytes)", "src/deep/c.py (1 bytes)"]
    assert ok(call(s, "list_files", pattern="src")).split("\n") == [
        "src/b.py (1 bytes)", "src/d.txt (1 bytes)", "src/deep/"]
    assert ok(call(s, "list_files", pattern="src/*.py")) == "src/b.py (1 bytes)"
    assert ok(call(s, "list_files", pattern="node_modules/**/*.py")) == (
        "node_modules/x/f.py (1 bytes)")
    assert "more than 2 entries" in ok(call(s, "list_files", pattern="**/*", max_entries=2))
    assert "no '..'" in error(call(s, "list_files", pattern="../*"))
    assert "outside the workspace" in error(call(s, "list_files", pattern="out/*"))


def test_search_finds_lines_skips_binaries_and_stops_at_the_bound(s: Settings,
                                                                   root: Path) -> None:
    (root / "src").mkdir()
    (root / "src/app.py").write_text("import os\ndef main():\n    return os.getcwd()\n")
    (root / "notes.md").write_text("call main() first\n")
    (root / "blob.bin").write_bytes(b"main\0main")
    assert ok(call(s, "search_files", pattern=r"def \w+\(")) == "src/app.py:2: def main():"
    assert ok(call(s, "search_files", pattern="l main()", fixed_strings=True)) == (
        "notes.md:1: call main() first")
    assert ok(call(s, "search_files", pattern="MAIN", ignore_case=True, glob="*.py")) == (
        "src/app.py:2: def main():")
    assert ok(call(s, "search_files", pattern="os", path="src/app.py")).count("\n") == 1
    (root / "many.txt").write_text("hit\n" * 50)
    many = ok(call(s, "search_files", pattern="hit", max_results=10))
    assert many.count("many.txt:") == 10 and many.endswith("[stopped at 10 matches; narrow the search]")
    assert "invalid regular expression" in error(call(s, "search_files", pattern="(unclosed"))
    assert "no matches" in ok(call(s, "search_files", pattern="absent"))


def test_a_pathological_pattern_stops_at_its_time_bound(s: Settings, root: Path) -> None:
    import time

    from fermix_worker.tools.files.limits import SEARCH_REGEX_SECONDS

    (root / "a.txt").write_text("a" * 60 + "b\n")
    started = time.monotonic()
    why = error(call(s, "search_files", pattern="^(a|aa)+$"))  # exponential backtracking
    took = time.monotonic() - started
    assert f"took longer than {SEARCH_REGEX_SECONDS:g} s" in why
    assert took < SEARCH_REGEX_SECONDS + 1.5, took


def test_search_does_not_follow_symlinks_out(s: Settings, root: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("password=hunter2\n")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    (root / "dir").symlink_to(tmp_path)
    assert "no matches" in ok(call(s, "search_files", pattern="hunter2"))
    assert "outside the workspace" in error(call(s, "search_files", pattern="x", path="link.txt"))


def test_glob_regex() -> None:
    assert glob_regex("**/*.py").fullmatch("a.py")
    assert glob_regex("**/*.py").fullmatch("x/y/a.py")
    assert not glob_regex("*.py").fullmatch("x/a.py")
    assert glob_regex("file[0-9].txt").fullmatch("file7.txt")
    assert glob_regex("[!a]?").fullmatch("bc") and not glob_regex("[!a]?").fullmatch("ac")
    assert glob_regex("a.b").fullmatch("a.b") and not glob_regex("a.b").fullmatch("axb")


def test_an_edit_that_would_grow_the_file_past_the_cap_is_refused_before_it_is_built(
    s: Settings, root: Path,
) -> None:
    from fermix_worker.tools.files.limits import WRITE_MAX_BYTES

    (root / "small.txt").write_text("x\n" * 1000)  # 2 KB
    why = error(call(s, "edit_file", path="small.txt", old_string="x",
                     new_string="y" * 10_000, replace_all=True))
    assert why == (f"Error: the edit would make small.txt 10,001,000 bytes (1,000 occurrences "
                   f"replaced); the limit is {WRITE_MAX_BYTES:,} bytes. Nothing was changed")
    assert (root / "small.txt").read_text() == "x\n" * 1000
    ok(call(s, "edit_file", path="small.txt", old_string="x", new_string="y" * 100,
            replace_all=True))
    assert (root / "small.txt").stat().st_size == 101_000


def test_a_subagent_reads_its_parent_s_workspace_and_can_write_nothing_in_it(
    s: Settings, root: Path
) -> None:
    (root / "notes.txt").write_text("one\ntwo\n")
    # No turn of its own: the subagent's context names the parent's root (issue 27). Even a
    # write tool handed to it (the subagent registry never offers one) cannot write.
    ctx = RunContext(subagent=SubagentContext(trust="operator", workspace=str(root)))
    registry = ToolRegistry(file_tools(s))

    def run(name: str, **args: Any) -> ToolResult:
        return registry.execute(ToolCall(id="c", name=name, arguments=args), ctx)

    assert "one" in ok(run("read_file", path="notes.txt"))
    assert "notes.txt" in ok(run("list_files"))
    assert "notes.txt:2: two" in ok(run("search_files", pattern="two"))
    refused = f"Error: {READ_ONLY}"
    assert error(run("write_file", path="new/x.txt", content="x")) == refused
    assert error(run("edit_file", path="notes.txt", old_string="one", new_string="1")) == refused
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]
    assert (root / "notes.txt").read_text() == "one\ntwo\n"
    bare = RunContext(subagent=SubagentContext(trust="operator"))
    assert registry.execute(ToolCall(id="c", name="read_file", arguments={"path": "notes.txt"}),
                            bare).content == (
        "Error: there is no workspace here: the turn that started this subagent has none")
