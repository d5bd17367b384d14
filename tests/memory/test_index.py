"""The in-process index of accepted memories (workbench/memory/index.py): it ranks as the reference functions do,
sees every write (this store object's, another one's, a raw transaction's), and never returns a memory that
was retired or redacted after it was built."""

from __future__ import annotations

import json
import random
from datetime import datetime

import pytest

from workbench.log.duckdb_log import DuckDBLog
from workbench.memory.relevance import document, rank, scores
from workbench.memory.semantic import Embeddings, recall_rank
from workbench.memory.store import MemoryStore, held_back

ANN = "person:ann"
REFERENCE = Embeddings()  # the from-scratch recall's cache (by memory version: it never answers for the index)
SUBJECTS = ["the billing service", "the nightly build", "the sales dashboard", "the ingestion job", "the eval set"]
CLAIMS = ["uses polars for dataframes", "never uses polars for dataframes", "runs on the GPU cluster",
          "must avoid the GPU cluster", "writes parquet files", "does not write parquet files", "is owned by Dana"]


@pytest.fixture
def log(tmp_path):
    log = DuckDBLog(tmp_path / "index.duckdb")
    yield log
    log.close()


def _fill(store: MemoryStore, n: int, seed: int = 3, where: str = "default") -> list[str]:
    rnd = random.Random(seed)
    ids = []
    for i in range(n):
        subject, claim = rnd.choice(SUBJECTS), rnd.choice(CLAIMS)
        ids.append(store.create(title=f"{subject.capitalize()} {claim}", text=f"{subject.capitalize()} {claim} (note {i}).",
                                tags=[rnd.choice(["data", "ops"])], actor="api", provenance=[], status="accepted", store=where))
    return ids


def _reference(store: MemoryStore, query: str, stores: list[str]) -> tuple[list[str], dict, list[str]]:
    """What injection ranks and holds back and what recall finds, computed from scratch (the old way)."""
    accepted = store.list(status="accepted", store=stores, annotate=False)
    held = held_back(accepted)
    ranked = [m["id"] for m, _ in rank([m for m in accepted if m["id"] not in held], query)]
    found = [m["id"] for m, s in recall_rank(accepted, query, REFERENCE) if s > 0][:5]
    return ranked, held, found


def _indexed(store: MemoryStore, query: str, stores: list[str]) -> tuple[list[str], dict, list[str]]:
    index = store.indexes.of(stores)
    with index.fresh():
        ranked = [e.memory["id"] for e, _ in index.ranked(query)]
        held = index.held_back()
    return ranked, held, [m["id"] for m, _ in store.recall(query, stores, 5)]


def test_bm25_of_the_index_is_bm25s_lucene(log):
    store = MemoryStore(log)
    _fill(store, 40)
    store.create(title="Only stop words", text="the and of it is", actor="api", provenance=[], status="accepted")
    store.create(title="Ünïcode dataframe naïve", text="dataframes ünïcode \x00 nul \u202e", actor="api",
                 provenance=[], status="accepted")
    index = store.indexes.of(["default"])
    for query in ["polars dataframes", "dataframe", "the", "GPU GPU cluster", "nothing matches zzz", "", "\udcff"]:
        with index.fresh():
            got = index.bm25(query)
            ids = index._arrays()["ids"]
        by_id = {m["id"]: m for m in store.list(status="accepted", annotate=False)}
        want = scores([document(by_id[i]) for i in ids], query)
        assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6), query


def test_the_index_ranks_holds_back_and_recalls_as_from_scratch_through_every_kind_of_write(log):
    store = MemoryStore(log)
    _fill(store, 60)
    _fill(store, 10, seed=5, where="team")
    queries = ["polars dataframes", "who owns the billing service", "GPU", "parquet"]
    index = store.indexes.of(["default"])

    def agree(asked: list[str]) -> None:
        for q in asked:
            assert _indexed(store, q, ["default"]) == _reference(store, q, ["default"]), q
            assert _indexed(store, q, ["default", "team"]) == _reference(store, q, ["default", "team"]), q

    agree(queries)
    built = index.rebuilds
    rnd = random.Random(9)
    for step in range(8):
        live = [m["id"] for m in store.list(status="accepted", store="default", annotate=False)]
        target = rnd.choice(live)
        kind = step % 4
        if kind == 0:
            store.review(target, "edit", ANN, text=f"The billing service never uses polars (edit {step}).")
        elif kind == 1:
            store.review(target, "retire", ANN, reason="out of date")
        elif kind == 2:
            new = store.create(title="The nightly build uses polars for dataframes", text=f"Seen again ({step}).",
                               actor="api", provenance=[])
            store.review(new, "accept", ANN)
        else:
            newer = rnd.choice([i for i in live if i != target])
            store.review(target, "supersede", ANN, by=newer)
        agree(queries[step % 2::2])
    assert index.rebuilds == built, "ordinary writes update the index in place; only a redaction rebuilds it"


def test_a_write_by_another_store_object_or_a_raw_transaction_is_seen(log):
    mine, theirs = MemoryStore(log), MemoryStore(log)
    _fill(mine, 5)
    assert mine.recall("flamingo", ["default"], 5) == []
    mid = theirs.create(title="Flamingo pipeline", text="The flamingo pipeline writes parquet.", actor="api",
                        provenance=[], status="accepted")
    assert [m["id"] for m, _ in mine.recall("flamingo", ["default"], 5)] == [mid]

    def older_version(tx):  # a version stamped before the newest one (a clock set back): the counts disagree
        tx.execute("INSERT INTO memory_versions SELECT memory_id, version + 1, ?, actor, 'retire', title, text, tags, "
                   "'retired', provenance, note FROM memory_versions WHERE memory_id = ? AND version = 1",
                   [datetime(2001, 1, 1), mid])

    log.write(older_version).result()
    assert mine.recall("flamingo", ["default"], 5) == []
    text, used, _, _ = mine.injection("flamingo", ["default"])
    assert mid not in {u["id"] for u in used} and "Flamingo" not in text


def test_a_retired_or_redacted_memory_never_comes_back_from_a_built_index(log):
    store, other = MemoryStore(log), MemoryStore(log)
    _fill(store, 8)
    keep = store.create(title="Heron jobs run nightly", text="The heron jobs run at 02:00 nightly.", actor="api",
                        provenance=[], status="accepted")
    gone = store.create(title="Heron secret", text="The heron deploy key lives in the shared drive.", actor="api",
                        provenance=[], status="accepted")
    assert {m["id"] for m, _ in store.recall("heron", ["default"], 5)} == {keep, gone}
    index = store.indexes.of(["default"])
    built = index.rebuilds
    other.review(gone, "redact", ANN, reason="a key's location")
    assert {m["id"] for m, _ in store.recall("heron", ["default"], 5)} == {keep}
    text, used, _, _ = store.injection("heron deploy key", ["default"])
    assert gone not in {u["id"] for u in used} and "shared drive" not in text
    assert index.rebuilds == built + 1
    other.review(keep, "retire", ANN, reason="moved")
    assert store.recall("heron", ["default"], 5) == []
    assert keep not in {u["id"] for u in store.injection("heron", ["default"])[1]}


def test_memories_that_share_a_timestamp_and_hostile_texts_are_all_indexed(log):
    store = MemoryStore(log)
    ts = datetime(2026, 12, 1, 12, 0, 0)

    def same_instant(tx):
        for i in range(30):
            store.tx_create(tx, title=f"Stork note {i}", text=f"stork {'x' * (i * 300)} <script>alert({i})</script>",
                            actor="api", provenance=[], status="accepted")
        tx.execute("UPDATE memory_versions SET ts = ?", [ts])  # one instant for all: the mark's newest time ties

    log.write(same_instant).result()
    assert len(store.recall("stork", ["default"], 20)) == 20
    new = store.create(title="Stork late", text="stork arrives", actor="api", provenance=[], status="accepted")

    def tie(tx):
        tx.execute("UPDATE memory_versions SET ts = ? WHERE memory_id = ?", [ts, new])

    log.write(tie).result()
    ids = {m["id"] for m, _ in store.recall("arrives", ["default"], 20)}
    assert ids == {new}
    assert store.injection("stork", ["nonexistent-store"]) == ("", [], 0, [])


def test_many_mount_sets_keep_a_bounded_number_of_indexes(log):
    from workbench.memory.index import MAX_INDEXES

    store = MemoryStore(log)
    for i in range(MAX_INDEXES + 4):
        store.recall("anything", [f"s{i}"], 5)
    assert len(store.indexes._by) == MAX_INDEXES
    assert json.dumps(store.injection(None, ["default"])) == json.dumps(("", [], 0, []))


def test_an_index_of_no_memories_computes_no_embedding(log, monkeypatch):
    """A session made where no memory exists asks the index for its preamble: with no rows there is nothing to
    embed, and numpy (a tenth of a second of a CLI command's CPU) is not imported for it."""
    store = MemoryStore(log)
    store.injection("warm up")  # the memory table exists, empty

    def refuse(self, memories):
        raise AssertionError(f"embedded {len(memories)} memories")

    monkeypatch.setattr(Embeddings, "of", refuse)
    other = MemoryStore(log)  # a store object of its own: its index is built from the file's empty table
    assert other.injection("hello") == ("", [], 0, [])
