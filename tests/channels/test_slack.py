"""SlackChannel over real HTTP (the official WebClient against the fake Slack Web API) and a
real Redis (private db 14, flushed per test)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator

import pytest
import redis

from fermix_dev.procs import wait_until
from fermix_shared import keys
from fermix_shared.channels.base import (
    AsksApproval,
    ChannelError,
    OutboundChannel,
    SendsPrivately,
)
from fermix_shared.channels.slack import SlackChannel
from fermix_shared.channels.slack_format import MARKDOWN_LIMIT, MESSAGE_LIMIT, to_mrkdwn
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from tests.fakes.slack_api import FakeSlack
from tests.seed_text import quoted

THREAD = ConversationKey(channel="slack", chat_id="C0123CHAN", thread_scope="1712345678.000200")
DM = ConversationKey(channel="slack", chat_id="D0456DM", thread_scope="root")
USER_MESSAGE_TS = "1712345678.000300"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:  # a fresh server (and URL) per test: per-workspace memory resets
        yield fake


def settings_for(slack: FakeSlack) -> Settings:
    return Settings(slack_bot_token="xoxb-test-token", slack_api_base=slack.url)


@pytest.fixture
def channel(slack: FakeSlack, r: redis.Redis) -> SlackChannel:
    return SlackChannel(settings_for(slack), r)


def test_it_is_an_outbound_channel(channel: SlackChannel) -> None:
    ch: OutboundChannel = channel
    assert ch.name == "slack"


def test_a_private_message_is_ephemeral_to_one_user_in_the_thread(
        channel: SlackChannel, slack: FakeSlack) -> None:
    assert isinstance(channel, SendsPrivately)
    channel.send_private(THREAD, "U0GUEST", "Sorry, **only** the owner.")
    [call] = slack.calls("chat.postEphemeral")
    assert {k: call.args[k] for k in ("channel", "user", "thread_ts", "text")} == {
        "channel": "C0123CHAN", "user": "U0GUEST", "thread_ts": "1712345678.000200",
        "text": "Sorry, *only* the owner."}
    assert slack.calls("chat.postMessage") == [] and slack.channel("C0123CHAN") == []


def test_a_short_reply_is_one_markdown_block_with_mrkdwn_text_in_the_thread(
        channel: SlackChannel, slack: FakeSlack) -> None:
    channel.send_text(THREAD, "Hello **there**", delivery_id="d1")
    [call] = slack.calls("chat.postMessage")
    assert call.args["channel"] == "C0123CHAN"
    assert call.args["thread_ts"] == "1712345678.000200"
    assert call.args["blocks"] == [{"type": "markdown", "text": "Hello **there**"}]
    assert call.args["text"] == "Hello *there*"  # notifications and clients without blocks
    assert call.args["unfurl_links"] in (False, "0", "false")
    assert call.token == "xoxb-test-token"


RICH = """# Release notes

Some **bold** text, a [link](https://example.com/a?b=1&c=2) and `x < y`.

| Name | Value |
|------|-------|
| a    | 1     |
| b    | 2     |

```python
if a < b and **c**:
    print("*x*")
```
"""


def test_headings_tables_and_code_go_out_as_markdown_for_slack_to_render(
        channel: SlackChannel, slack: FakeSlack) -> None:
    channel.send_text(THREAD, RICH, delivery_id="rich")
    [call] = slack.calls("chat.postMessage")
    assert call.ok  # the fake checks blocks as Slack does
    [block] = call.args["blocks"]
    assert block == {"type": "markdown", "text": RICH.strip()}  # the Markdown, untouched
    assert "| Name | Value |\n|------|-------|" in block["text"]
    assert '```python\nif a < b and **c**:\n    print("*x*")\n```' in block["text"]
    text = call.args["text"]
    assert text == to_mrkdwn(RICH.strip())
    assert text.startswith("*Release notes*\n")  # mrkdwn has no headings: bold instead
    assert "<https://example.com/a?b=1&amp;c=2|link>" in text and "`x &lt; y`" in text
    [message] = slack.channel("C0123CHAN")
    assert message.markdown == RICH.strip()


def test_a_dm_outside_a_thread_is_posted_without_thread_ts(
        channel: SlackChannel, slack: FakeSlack) -> None:
    channel.send_text(DM, "hi", delivery_id="d1")
    [call] = slack.calls("chat.postMessage")
    assert call.args["channel"] == "D0456DM"
    assert "thread_ts" not in call.args


def long_reply() -> str:
    """About 30,000 characters of Markdown: headed parts of prose, each with a code block."""
    code = "\n".join(f"    step_{j}()  # the {j}th step" for j in range(30))
    parts = [f"## Part {i}\n\n" + "lorem ipsum dolor sit amet " * 30
             + f"\n\n```python\ndef part_{i}() -> None:\n{code}\n```" for i in range(18)]
    return "\n\n".join(parts)[:30_000]


def test_a_30000_character_answer_is_three_messages_in_order_in_the_thread(
        channel: SlackChannel, slack: FakeSlack) -> None:
    text = long_reply()
    assert len(text) == 30_000
    channel.send_text(THREAD, text, delivery_id="long")
    calls = slack.calls("chat.postMessage")
    assert len(calls) == 3 and all(c.ok for c in calls)
    assert all(c.args["thread_ts"] == THREAD.thread_scope for c in calls)
    pieces = [c.args["blocks"][0]["text"] for c in calls]
    assert all(len(c.args["blocks"]) == 1 for c in calls)
    assert all(len(p) <= MARKDOWN_LIMIT == 12_000 for p in pieces)
    assert all(p.count("```") % 2 == 0 for p in pieces), "every piece's code fences balanced"
    joined = "\n\n".join(pieces)
    at = [joined.index(f"## Part {i}\n") for i in range(18) if f"## Part {i}\n" in text]
    assert len(at) >= 15 and at == sorted(at), "every part once, in order"
    assert all(f"def part_{i}()" in joined for i in range(15))
    # The fallback is mrkdwn, under Slack's advised 4,000 characters (cut short: the block
    # holds the whole piece).
    assert all(len(c.args["text"]) <= MESSAGE_LIMIT for c in calls)
    assert all(c.args["text"].startswith(to_mrkdwn(p)[:200]) for c, p in zip(calls, pieces,
                                                                               strict=True))
    # Paced by the shared per-channel limiter: about one message a second.
    assert calls[-1].at - calls[0].at >= (len(calls) - 1) * 0.9


def test_a_live_message_is_a_markdown_block_in_every_version(
        channel: SlackChannel, slack: FakeSlack) -> None:
    shown = channel.live_text("# Plan\n\n```sh\nmake te")  # half-written: the fence closed
    assert shown == "# Plan\n\n```sh\nmake te\n```"
    ts = channel.post_live(THREAD, shown)
    channel.edit_live(THREAD, ts, channel.live_text(RICH))
    with pytest.raises(ChannelError, match="nothing to show"):
        channel.edit_live(THREAD, ts, "  ")
    post, update = slack.calls("chat.postMessage") + slack.calls("chat.update")
    assert post.args["blocks"] == [{"type": "markdown", "text": shown}]
    assert post.args["text"] == "*Plan*\n\n```\nmake te\n```"
    assert update.args["blocks"] == [{"type": "markdown", "text": RICH.strip()}]
    assert update.args["text"] == to_mrkdwn(RICH.strip())
    [message] = slack.channel("C0123CHAN")
    assert [v for _, v in message.versions] == [shown, RICH.strip()]


def test_a_429_with_retry_after_delays_and_the_message_arrives_once(
        channel: SlackChannel, slack: FakeSlack, r: redis.Redis) -> None:
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    started = time.monotonic()
    channel.send_text(THREAD, "after the pause", delivery_id="rl")
    assert time.monotonic() - started >= 1.0
    failed, sent = slack.calls("chat.postMessage", ok=False), slack.calls("chat.postMessage", ok=True)
    assert len(failed) == 1 and len(sent) == 1
    assert sent[0].args["text"] == "after the pause"
    assert sent[0].args["blocks"] == failed[0].args["blocks"]
    assert sent[0].at - failed[0].at >= 1.0


def test_the_same_delivery_twice_sends_nothing_the_second_time(
        channel: SlackChannel, slack: FakeSlack, r: redis.Redis) -> None:
    channel.send_text(THREAD, "once", delivery_id="dup")
    channel.send_text(THREAD, "once", delivery_id="dup")
    assert len(slack.calls("chat.postMessage")) == 1
    assert 0 < r.ttl(keys.delivered("dup")) <= keys.DEDUPE_TTL_SECONDS


def test_an_interrupted_delivery_resumes_at_the_next_unsent_chunk(
        slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, sleep=lambda s: None)  # pacing is not the point here
    text = long_reply()
    channel.send_text(THREAD, text, delivery_id="probe")  # how this text is cut
    expected = [c.args["blocks"] for c in slack.calls("chat.postMessage")]
    assert len(expected) == 3
    slack.reset()

    slack.error_next("chat.postMessage", "fatal_error", after=2)  # two out, then refused
    with pytest.raises(ChannelError, match="fatal_error"):
        channel.send_text(THREAD, text, delivery_id="resume")
    assert [c.args["blocks"] for c in slack.calls("chat.postMessage", ok=True)] == expected[:2]
    assert sorted(r.hkeys(keys.delivered("resume"))) == ["0", "1"]

    channel.send_text(THREAD, text, delivery_id="resume")  # the delivery is retried
    assert [c.args["blocks"] for c in slack.calls("chat.postMessage", ok=True)] == expected


def test_a_permanent_error_is_a_channel_error(channel: SlackChannel, slack: FakeSlack) -> None:
    slack.error_next("chat.postMessage", "channel_not_found")
    with pytest.raises(ChannelError, match="channel_not_found"):
        channel.send_text(THREAD, "hi", delivery_id="x")
    assert len(slack.calls("chat.postMessage")) == 1


def test_rate_limits_beyond_five_attempts_give_up(slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, sleep=lambda s: None)
    for _ in range(6):
        slack.fail_next("chat.postMessage", status=429, retry_after=1)
    with pytest.raises(ChannelError, match="ratelimited"):
        channel.send_text(THREAD, "hi", delivery_id="x")
    assert len(slack.calls("chat.postMessage")) == 5


def test_working_sets_the_thread_status_and_clears_it(
        channel: SlackChannel, slack: FakeSlack) -> None:
    with channel.working(THREAD, USER_MESSAGE_TS):
        [on] = slack.calls("assistant.threads.setStatus")
        assert on.args == {"channel_id": "C0123CHAN", "thread_ts": THREAD.thread_scope,
                           "status": "is working…"}
    on, off = slack.calls("assistant.threads.setStatus")
    assert off.args["status"] == ""
    assert slack.calls("reactions.add") == []


def statuses(slack: FakeSlack) -> list[str]:
    return [c.args["status"] for c in slack.calls("assistant.threads.setStatus")]


def test_the_working_cadence_is_the_seeds_every_4_seconds_for_5_minutes() -> None:
    assert quoted("F", "sends a typing indicator to the channel every 4 seconds")
    assert quoted("F", "The indicator stops after 5 minutes regardless of turn state.")
    defaults = inspect.signature(SlackChannel).parameters
    assert defaults["typing_interval"].default == 4.0
    assert defaults["typing_max"].default == 5 * 60.0


def test_working_sets_the_thread_status_again_every_interval_until_the_turn_ends(
        slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, typing_interval=0.05)
    with channel.working(THREAD, USER_MESSAGE_TS):
        wait_until(lambda: len(statuses(slack)) >= 4, 5, "the status set four times")
    shown = statuses(slack)
    assert shown[:-1] == ["is working…"] * (len(shown) - 1) and shown[-1] == ""
    at = [c.at for c in slack.calls("assistant.threads.setStatus")][:4]
    assert all(b - a >= 0.04 for a, b in zip(at, at[1:], strict=False)), at
    assert statuses(slack) == shown, "nothing is set after the turn ended"
    assert slack.calls("reactions.add") == []


def test_working_stops_after_its_cap_while_the_turn_still_runs(
        slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, typing_interval=0.05, typing_max=0.3)
    with channel.working(THREAD, USER_MESSAGE_TS):
        wait_until(lambda: "" in statuses(slack), 5, "the status cleared at the cap")
        calls = slack.calls("assistant.threads.setStatus")
        assert calls[-1].at - calls[0].at >= 0.3
        assert [c.args["status"] for c in calls[:-1]] == ["is working…"] * (len(calls) - 1)
        assert len(calls) >= 3, "refreshed before the cap"
    assert statuses(slack) == [c.args["status"] for c in calls], "cleared once, not again"


def test_the_eyes_reaction_comes_off_at_the_cap_too(slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, typing_interval=0.05, typing_max=0.2)
    with channel.working(DM, USER_MESSAGE_TS):
        wait_until(lambda: bool(slack.calls("reactions.remove")), 5, "the reaction removed")
    assert [c.method for c in slack.calls()] == ["reactions.add", "reactions.remove"]


def test_working_falls_back_to_eyes_when_the_workspace_has_no_thread_status(
        channel: SlackChannel, slack: FakeSlack) -> None:
    slack.error_next("assistant.threads.setStatus", "unknown_method")
    with channel.working(THREAD, USER_MESSAGE_TS):
        [add] = slack.calls("reactions.add")
        assert add.args == {"channel": "C0123CHAN", "timestamp": USER_MESSAGE_TS, "name": "eyes"}
        assert slack.calls("reactions.remove") == []
    [remove] = slack.calls("reactions.remove")
    assert remove.args == add.args

    # Remembered for the process: the next turn goes straight to the reaction.
    with channel.working(THREAD, USER_MESSAGE_TS):
        pass
    assert len(slack.calls("assistant.threads.setStatus")) == 1
    assert len(slack.calls("reactions.add")) == 2


def test_working_in_a_dm_reacts_to_the_message(channel: SlackChannel, slack: FakeSlack) -> None:
    with channel.working(DM, USER_MESSAGE_TS):
        pass
    assert slack.calls("assistant.threads.setStatus") == []
    assert [c.method for c in slack.calls()] == ["reactions.add", "reactions.remove"]


def test_working_never_raises(slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r)
    slack.error_next("assistant.threads.setStatus", "ratelimited")
    slack.error_next("reactions.add", "message_not_found")
    with channel.working(THREAD, USER_MESSAGE_TS):
        pass
    slack.stop()  # Slack unreachable altogether
    with channel.working(DM, USER_MESSAGE_TS):
        pass
    # and an error inside the block is the caller's, untouched
    with pytest.raises(KeyError), channel.working(DM, None):
        raise KeyError("boom")


def test_bot_user_id_comes_from_auth_test_once(channel: SlackChannel, slack: FakeSlack) -> None:
    assert channel.bot_user_id() == slack.bot_user_id
    assert channel.bot_user_id() == slack.bot_user_id
    assert len(slack.calls("auth.test")) == 1


def test_no_token_is_a_channel_error(slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(Settings(slack_api_base=slack.url), r)
    with pytest.raises(ChannelError, match="FERMIX_SLACK_BOT_TOKEN"):
        channel.send_text(DM, "hi", delivery_id="x")
    with channel.working(DM, USER_MESSAGE_TS):
        pass


# -- approval questions with buttons -----------------------------------------------------------

QUESTION = ("Approval needed (ab12cd34): run `shell` with `{\"cmd\": \"rm -rf build\"}`?\n"
            "Answer /approve ab12cd34 or /deny ab12cd34 (no answer in 10 min denies it).")


def buttons(approval_id: str) -> dict[str, object]:
    return {"type": "actions", "block_id": f"fx_approval_{approval_id}", "elements": [
        {"type": "button", "action_id": "fx_approve", "style": "primary", "value": approval_id,
         "text": {"type": "plain_text", "text": "Approve"}},
        {"type": "button", "action_id": "fx_deny", "style": "danger", "value": approval_id,
         "text": {"type": "plain_text", "text": "Deny"}},
    ]}


def test_an_approval_question_is_a_markdown_block_and_two_buttons_in_the_thread_once(
        channel: SlackChannel, slack: FakeSlack) -> None:
    assert isinstance(channel, AsksApproval)
    channel.send_approval(THREAD, "ab12cd34", QUESTION, delivery_id="approval:ab12cd34")
    channel.send_approval(THREAD, "ab12cd34", QUESTION, delivery_id="approval:ab12cd34")
    [call] = slack.calls("chat.postMessage")
    assert call.ok
    assert call.args["channel"] == "C0123CHAN"
    assert call.args["thread_ts"] == THREAD.thread_scope
    assert call.args["text"] == to_mrkdwn(QUESTION)  # the notification fallback
    assert call.args["blocks"] == [{"type": "markdown", "text": QUESTION}, buttons("ab12cd34")]


def test_an_approval_question_in_a_dm_is_posted_outside_any_thread(
        channel: SlackChannel, slack: FakeSlack) -> None:
    channel.send_approval(DM, "ab12cd34", QUESTION, delivery_id="approval:dm")
    [call] = slack.calls("chat.postMessage", ok=True)
    assert "thread_ts" not in call.args
    assert call.args["blocks"][1] == buttons("ab12cd34")


def test_a_long_question_fits_slacks_markdown_limit_with_buttons_on_the_last_message(
        slack: FakeSlack, r: redis.Redis) -> None:
    channel = SlackChannel(settings_for(slack), r, sleep=lambda s: None)
    text = long_reply()[:20_000] + "\n\n" + QUESTION
    channel.send_approval(THREAD, "ab12cd34", text, delivery_id="approval:long")
    calls = slack.calls("chat.postMessage")
    assert len(calls) == 2 and all(c.ok for c in calls)  # the fake refuses invalid_blocks
    assert all(len(c.args["blocks"][0]["text"]) <= MARKDOWN_LIMIT for c in calls)
    assert all(len(c.args["text"]) <= MESSAGE_LIMIT for c in calls)
    assert [[b["type"] for b in c.args["blocks"]] for c in calls] == [
        ["markdown"], ["markdown", "actions"]]
    assert calls[-1].args["blocks"][0]["text"].endswith(QUESTION)
    assert calls[-1].args["blocks"][1] == buttons("ab12cd34")


def test_a_malformed_approval_id_posts_nothing(channel: SlackChannel, slack: FakeSlack) -> None:
    with pytest.raises(ValueError, match="approval id"):
        channel.send_approval(THREAD, "not-an-id", QUESTION, delivery_id="x")
    assert slack.calls("chat.postMessage") == []
