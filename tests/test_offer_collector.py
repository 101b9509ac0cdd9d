"""The cycle collector on the per-start path: off once the decider answered (the start's short
rest runs without its passes, tests/test_live_imports.py pins that per route), on again for every
start that decides in its own process, so a big in-process decision keeps it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hook.routes import client, offer, wire
from hook.routes.act import Session


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    yield
    gc.enable()


@pytest.mark.parametrize(
    ("answer", "why"),
    [(b"not an answer", "an answer this hook cannot read"), (None, "")],
    ids=["unreadable answer", "no decider"],
)
def test_a_start_decided_in_process_keeps_the_collector(
    monkeypatch: pytest.MonkeyPatch, answer: bytes | None, why: str
) -> None:
    got = ("answered", answer) if answer is not None else ("", "")
    monkeypatch.setattr(client, "ask", lambda route, fp, parts, meanwhile=None: got)
    monkeypatch.setattr(offer, "decider_setting", lambda path: "")
    monkeypatch.setattr(wire, "fingerprint", lambda opts, path: b"")
    session = Session("prestart")
    assert gc.isenabled()
    assert offer._offer(b"live", {}, [], session) is None
    assert gc.isenabled()
    assert session.decider == ("fallback" if answer is not None else "")
    assert all(why in w for w in session.warnings)
