"""The event protocol: NDJSON round trips and exactly one final event."""

from __future__ import annotations

from ster.engine.protocol.events import Error, Log, Progress, Result, Token, Warning, parse_event


def test_every_event_round_trips_through_one_json_line() -> None:
    events = [
        Progress(stage="read", current=1, total=3, message="reading prompt 1/3"),
        Token(text=" river", index=4),
        Warning(message="careful"),
        Log(message="note"),
        Result(command="generate", data={"text": "x"}),
        Error(kind="refused", message="no"),
    ]
    for event in events:
        line = event.to_json()
        assert "\n" not in line
        assert parse_event(line) == event
