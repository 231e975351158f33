"""MemoryStore against a private redis-server: de-duplication, replace/archive/forget, caps,
deterministic recall, and memory that outlives /new."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from fermix_gateway.commands import Caller, Command, handle
from fermix_shared import keys
from fermix_shared.memory import MAX_FACT_CHARS, MAX_FORGET_AT_ONCE, MemoryRefused, MemoryStore
from fermix_shared.messages import ChatMessage
from fermix_shared.models import ConversationKey
from fermix_shared.settings import Settings
from fermix_shared.stores import history

CONV = "telegram|42|root"


@pytest.fixture
def store(r: redis.Redis) -> MemoryStore:
    return MemoryStore(r)


def test_a_repeat_in_another_case_or_spacing_is_the_same_fact(store: MemoryStore) -> None:
    fact, new = store.add_fact("The user prefers  metric units.", CONV)
    again, again_new = store.add_fact("the user prefers metric units", "tool")
    assert new and not again_new
    assert again == fact and fact.text == "The user prefers metric units."
    assert (fact.source, fact.status) == (CONV, "active")
    assert [f.id for f in store.active()] == [fact.id]


def test_recall_ranks_by_overlap_and_is_deterministic(store: MemoryStore) -> None:
    dog = store.add("The user's dog is called Rex.", CONV)
    store.add("The user prefers metric units.", CONV)
    store.add("The user works on the Fermix project in Python.", CONV)
    assert store.recall("what's my dog's name?")[0] == dog
    assert [f.text for f in store.recall("python project", 1)] == [
        "The user works on the Fermix project in Python."
    ]
    assert store.recall("quantum chromodynamics") == []
    # An empty query lists the most recent facts.
    assert [f.id for f in store.recall("", 2)] == [f.id for f in store.active()[::-1][:2]]
    assert store.recall("dog") == store.recall("dog")


def test_recall_weighs_a_rare_word_above_one_every_fact_has(store: MemoryStore) -> None:
    # BM25: "user" is in nearly every fact and says little; "dog" is in one and says much.
    dog = store.add("Rex is a dog.", CONV)
    for text in ("The user drinks tea.", "The user lives in Lyon.", "The user cycles."):
        store.add(text, CONV)
    assert store.recall("user dog")[0] == dog
    assert len(store.recall("user dog")) == 4  # the tool still lists only facts that match


def test_replace_updates_the_text_and_its_de_duplication(store: MemoryStore) -> None:
    fact = store.add("The user lives in Lyon.", CONV)
    moved = store.replace(fact.id, "The user lives in Paris.")
    assert (moved.id, moved.text, moved.created_at) == (fact.id, "The user lives in Paris.",
                                                        fact.created_at)
    assert store.add_fact("the user lives in paris", "tool") == (moved, False)
    lyon, new = store.add_fact("The user lives in Lyon.", "tool")
    assert new and lyon.id != fact.id


def test_replacing_with_what_another_fact_says_archives_the_first(store: MemoryStore) -> None:
    a = store.add("The user drinks tea.", CONV)
    b = store.add("The user drinks coffee.", CONV)
    assert store.replace(a.id, "The user drinks coffee") == b
    assert [f.id for f in store.active()] == [b.id]
    archived = store.get(a.id)
    assert archived is not None and archived.status == "archived"


def test_archived_facts_leave_prompts_and_recall(store: MemoryStore) -> None:
    fact = store.add("The user is on holiday until May.", CONV)
    assert store.archive(fact.id).status == "archived"
    assert store.archive(fact.id).status == "archived"  # again: nothing to do
    assert store.active() == [] and store.recall("holiday") == []
    with pytest.raises(MemoryRefused, match="archived"):
        store.replace(fact.id, "The user is on holiday until June.")
    assert store.add_fact("The user is on holiday until May.", CONV)[1]  # new again


def test_forget_deletes_by_id_or_by_a_narrow_query(store: MemoryStore, r: redis.Redis) -> None:
    a = store.add("The user's sister is Ana.", CONV)
    b = store.add("The user's brother is Ben.", CONV)
    assert store.forget(fact_id=a.id) == [a]
    assert store.get(a.id) is None and store.forget(fact_id=a.id) == []
    assert store.forget(query="BROTHER") == [b]
    assert store.active() == [] and r.hlen(keys.memory_text_index()) == 0
    for i in range(MAX_FORGET_AT_ONCE + 1):
        store.add(f"Project {i} uses Python.", CONV)
    with pytest.raises(MemoryRefused, match="6 facts match"):
        store.forget(query="python")
    assert len(store.active()) == MAX_FORGET_AT_ONCE + 1


def test_caps_refuse_long_facts_and_a_full_memory(r: redis.Redis) -> None:
    store = MemoryStore(r, max_active=2)
    with pytest.raises(MemoryRefused, match=f"at most {MAX_FACT_CHARS} characters"):
        store.add("x" * (MAX_FACT_CHARS + 1), CONV)
    with pytest.raises(MemoryRefused, match="needs some text"):
        store.add("  \n ", CONV)
    first = store.add("Fact one.", CONV)
    store.add("Fact two.", CONV)
    assert store.add("fact two", CONV).text == "Fact two."  # a repeat is not refused
    with pytest.raises(MemoryRefused, match="memory is full"):
        store.add("Fact three.", CONV)
    store.archive(first.id)
    assert store.add("Fact three.", CONV).text == "Fact three."


def test_unknown_ids_are_refused(store: MemoryStore) -> None:
    with pytest.raises(MemoryRefused, match="no fact m404"):
        store.replace("m404", "anything")
    with pytest.raises(MemoryRefused, match="no fact m404"):
        store.archive("m404")


def test_new_empties_the_conversation_but_memory_persists(
    store: MemoryStore, r: redis.Redis, scratch_redis_url: str
) -> None:
    key = ConversationKey.parse(CONV)
    history.append(r, CONV, [ChatMessage(role="user", content="my dog is Rex")])
    fact = store.add("The user's dog is called Rex.", CONV)

    async def new() -> str | None:
        ar = aioredis.Redis.from_url(scratch_redis_url, decode_responses=True)
        try:
            out = await handle(ar, Settings(home=Path("/nonexistent")), key, Command("new", ""),
                               Caller("telegram:42", "operator"))
        finally:
            await ar.aclose()
        return out.reply

    assert asyncio.run(new()) == "Started a fresh conversation. Long-term memory is kept."
    assert history.load(r, CONV, 10) == []
    assert store.recall("dog") == [fact]
