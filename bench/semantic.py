"""What semantic dedupe and recall cost (workbench/memory/semantic.py): loading WordLlama, embedding memories
(once per version), a dream proposal's overlap check, and a recall, over N accepted memories.

    python -m bench.semantic [--memories N ...] [--queries K]

Memories are made from templates with words drawn at random (seeded), so no two say the same; the overlap
check and the recall run over a warm cache (every memory embedded already), as in a server that has run one.
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.semantic", description=__doc__.splitlines()[0])
    p.add_argument("--memories", type=int, nargs="+", default=[100, 1000, 10000])
    p.add_argument("--queries", type=int, default=20)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
