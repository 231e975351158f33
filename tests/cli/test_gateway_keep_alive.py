"""``fermix gateway --keep-alive SECONDS`` (or FERMIX_GATEWAY_KEEP_ALIVE): how long an idle
client connection stays open. Its effect on a real gateway: tests/gateway/test_long_poll.py."""

from __future__ import annotations

import pytest

from fermix_cli.main import KEEP_ALIVE_S, build_parser


def test_the_default_outlasts_httpx_reusing_an_idle_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx

    monkeypatch.delenv("FERMIX_GATEWAY_KEEP_ALIVE", raising=False)

    expiry = httpx.Limits().keepalive_expiry
    assert expiry is not None and expiry < KEEP_ALIVE_S
    assert build_parser().parse_args(["gateway"]).keep_alive == KEEP_ALIVE_S
    assert build_parser().parse_args(["gateway", "--keep-alive", "65"]).keep_alive == 65
    monkeypatch.setenv("FERMIX_GATEWAY_KEEP_ALIVE", "30")
    assert build_parser().parse_args(["gateway"]).keep_alive == 30


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "forever", "3601"])
def test_a_bad_keep_alive_is_a_sentence_and_exit_2(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["gateway", "--keep-alive", bad])
    assert exit_.value.code == 2
    assert (f"expected whole seconds from 1 to 3600 for an idle connection, not {bad!r}"
            in capsys.readouterr().err)
