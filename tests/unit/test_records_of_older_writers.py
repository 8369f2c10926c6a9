"""Records that an earlier PolyLoop wrote are read back, though the value types now check their
fields at construction: an ``Outcome`` journaled with ``marker: 1`` (the kernel treated it as
true and ended the run ``task_completed``), ``truncated_chars: true``, or ``Failure`` fields
that are not strings (no fingerprint was taken without ``same_failure_limit``) is history, not
damage. Each JSON below is the ``action_result`` record exactly as release 51028d2 stored it."""

from __future__ import annotations

import json

import pytest

from polyloop.types import ActionResult, ActionStatus, Failure, JournalError, record_from_dict

OLDER = (
    '{"kind":"action_result","latency_ms":0.1,"op_id":"5765609589e6ff05c5e0a9ae2c67e803",'
    '"outcome":{"completed":false,"failure":null,"marker":1,"observation":"done",'
    '"status":"executed","synthetic":false,"truncated_chars":0},"step_idx":0}'
)


def older(**outcome: object) -> dict[str, object]:
    d = json.loads(OLDER)
    d["outcome"].update(outcome)
    return d  # type: ignore[no-any-return]


def test_an_outcome_with_a_truthy_int_marker_reads_as_marker_true() -> None:
    r = record_from_dict(json.loads(OLDER))
    assert isinstance(r, ActionResult)
    assert r.outcome.marker is True and r.outcome.status is ActionStatus.executed
    assert record_from_dict(older(marker=0)).outcome.marker is False  # type: ignore[union-attr]


def test_a_bool_truncated_count_and_non_str_failure_fields_read_as_written_then() -> None:
    failure = {"check": 5, "error_type": "E", "top_frame": None, "message": ["a", 1]}
    r = record_from_dict(older(truncated_chars=True, failure=failure))
    assert isinstance(r, ActionResult)
    assert r.outcome.truncated_chars == 1 and type(r.outcome.truncated_chars) is int
    assert r.outcome.failure == Failure("5", "E", None, '["a",1]')


def test_a_record_that_no_version_wrote_is_still_damage() -> None:
    with pytest.raises(JournalError, match=r"Outcome\.marker"):
        record_from_dict(older(marker={"x": 1}))
    with pytest.raises(JournalError, match=r"Outcome\.truncated_chars"):
        record_from_dict(older(marker=False, truncated_chars=-1))
