"""A run started with a previous run's transcript as ``history=`` resumes, on each durable
journal, with the conversation it had: one system message, the same bytes."""

from __future__ import annotations

from tests.contract.test_phases_example import check_a_phase_resumes_with_the_same_conversation
from tests.durability.journals import Store


async def test_a_phase_started_with_a_previous_transcript_resumes_with_the_same_conversation(
    journal_backend: Store,
) -> None:
    async with journal_backend.journal() as journal:
        await check_a_phase_resumes_with_the_same_conversation(journal)
