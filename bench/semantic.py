"""What semantic dedupe and recall cost (workbench/memory/semantic.py): loading WordLlama, embedding memories
(once per version), a dream proposal's overlap check, and a recall, over N accepted memories.

    python -m bench.semantic [--memories N ...] [--queries K] [--store N ...]

Memories are made from templates with words drawn at random (seeded), so no two say the same; the overlap
check and the recall run over a warm cache (every memory embedded already), as in a server that has run one.

`--store N`: the same memories accepted into a real store (a DuckDB file in a temporary directory, a host with
the memory plugin and no kernels), then what a server pays with its in-process index (workbench/memory/index.py):
its first build, a new session's creation (`Brain.create_session` with a first message: the injection ranked
by it) and the `recall` tool's ranking, warm, and the update after one more memory is accepted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

SUBJECTS = ["the billing service", "the nightly build", "the sales dashboard", "the ingestion job", "the eval set",
            "the staging database", "the survey export", "the model checkpoints", "the API gateway", "the report"]
VERBS = ["runs on", "is owned by", "refreshes every", "writes to", "reads from", "is tested with", "must avoid",
         "is deployed by", "depends on", "is documented in"]
OBJECTS = ["polars", "duckdb", "the vault", "a cron job", "the shared drive", "pytest", "Dana", "the archive bucket",
           "fifteen minutes", "the wiki", "parquet files", "the GPU cluster", "yaml configs", "matplotlib"]
QUERIES = ["which dataframe library do we use", "who owns billing", "where are checkpoints kept",
           "how often does the dashboard refresh", "what runs the tests", "where do secrets go"]


def memories(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """n accepted memories with distinct statements."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        text = f"{rnd.choice(SUBJECTS).capitalize()} {rnd.choice(VERBS)} {rnd.choice(OBJECTS)} (case {i})."
        out.append({"id": f"m{i:09d}", "version": 1, "title": f"Note: {text[:60]}", "text": text, "tags": ["note"],
                    "provenance": [], "updated_at": f"2026-12-01T00:00:{i % 60:02d}", "status": "accepted"})
    return out


def ms(f: Any) -> float:
    t = time.perf_counter()
    f()
    return (time.perf_counter() - t) * 1000


def measure(n: int, queries: int) -> dict[str, float]:
    """The figures for n memories (ms)."""
    from workbench.memory.relevance import rank
    from workbench.memory.semantic import Embeddings, overlaps, recall_rank

    ms_ = memories(n)
    cache = Embeddings()
    cold = ms(lambda: cache.of(ms_))
    warm = ms(lambda: cache.of(ms_))
    asked = [QUERIES[i % len(QUERIES)] for i in range(queries)]
    proposals = [memories(queries, seed=11)[i] for i in range(queries)]
    return {
        "memories": n, "embed_all_ms": cold, "embed_per_memory_ms": cold / n, "warm_lookup_ms": warm,
        "overlap_p50_ms": statistics.median(ms(lambda p=p: overlaps(p["title"], p["text"], ms_, cache)) for p in proposals),
        "recall_p50_ms": statistics.median(ms(lambda q=q: recall_rank(ms_, q, cache)) for q in asked),
        "bm25_only_p50_ms": statistics.median(ms(lambda q=q: rank(ms_, q)) for q in asked),
    }


def in_store(n: int, queries: int) -> dict[str, float]:
    """The index's figures for n accepted memories in a real store (ms)."""
    import tempfile
    from pathlib import Path

    from workbench.host import Host
    from workbench.memory.plugin import MemoryPlugin

    with tempfile.TemporaryDirectory() as tmp:
        host = Host.build(Path(tmp) / "bench.duckdb", hands=False, plugins=[MemoryPlugin()])
        try:
            store = host.plugin("memory").store

            def fill(tx: Any) -> None:
                for m in memories(n):
                    store.tx_create(tx, title=m["title"], text=m["text"], tags=m["tags"], actor="api", provenance=[],
                                    status="accepted")

            host.log.write(fill).result()
            asked = [QUERIES[i % len(QUERIES)] for i in range(queries)]
            first = ms(lambda: store.injection(asked[0], ["default"]))

            def create(q: str) -> None:
                host.brain.create_session(title="bench", model="scripted:bench", message=q)

            create_p50 = statistics.median(ms(lambda q=q: create(q)) for q in asked)
            inject_p50 = statistics.median(ms(lambda q=q: store.injection(q, ["default"])) for q in asked)
            recall_p50 = statistics.median(ms(lambda q=q: store.recall(q, ["default"], 5)) for q in asked)
            mark_p50 = statistics.median(ms(store._change_mark) for _ in asked)  # the freshness check each use pays
            new = store.create(title="The billing service uses polars", text="Seen in a new session.", actor="api",
                               provenance=[])
            store.review(new, "accept", "person:bench")
            update = ms(lambda: store.injection(asked[0], ["default"]))
            return {"memories": n, "first_build_ms": first, "create_p50_ms": create_p50, "inject_p50_ms": inject_p50,
                    "recall_p50_ms": recall_p50, "mark_p50_ms": mark_p50,
                    "update_ms": update}
        finally:
            import asyncio

            asyncio.run(host.close())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.semantic", description=__doc__.splitlines()[0])
    p.add_argument("--memories", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--queries", type=int, default=20)
    p.add_argument("--store", type=int, nargs="*", default=[], help="memories accepted into a real store (the index)")
    args = p.parse_args(argv)
    from workbench.memory.semantic import model

    load = ms(model)
    print(f"WordLlama load (once per process): {load:,.0f} ms\n")
    print("| memories | embedding all, cold | per memory | cache lookup, warm | overlap check p50 | recall p50 "
          "(BM25 + embeddings) | BM25 alone p50 |")
    print("|---|---|---|---|---|---|---|")
    for n in args.memories:
        r = measure(n, args.queries)
        print(f"| {n:,} | {r['embed_all_ms']:,.1f} ms | {r['embed_per_memory_ms']:.3f} ms | {r['warm_lookup_ms']:,.1f} ms | "
              f"{r['overlap_p50_ms']:,.1f} ms | {r['recall_p50_ms']:,.1f} ms | {r['bm25_only_p50_ms']:,.1f} ms |")
    if args.store:
        print("\n| accepted memories in the store | index's first build | session creation p50 | its injection p50 | "
              "recall p50 | of which the change-mark query | after one more accepted |")
        print("|---|---|---|---|---|---|---|")
    for n in args.store:
        r = in_store(n, args.queries)
        print(f"| {n:,} | {r['first_build_ms']:,.0f} ms | {r['create_p50_ms']:,.1f} ms | {r['inject_p50_ms']:,.1f} ms | "
              f"{r['recall_p50_ms']:,.1f} ms | {r['mark_p50_ms']:,.1f} ms | {r['update_ms']:,.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
