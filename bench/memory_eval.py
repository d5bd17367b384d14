"""The memory evaluation: real sessions, real dreams with `scripted:dream`, figures from the store and the log.

    python -m bench.memory_eval [--quick] [--json OUT] [--write-docs]

For each sample of bench/fixtures/memory_eval.json (a LoCoMo-like fixture written for this project;
quick mode: the first sample only), in a DuckDB file of its own in a temporary directory:

1. its sessions are recorded batch by batch by the real brain (a scripted model says the assistant's
   turns), each session opened with its first message, so memories accepted so far are injected;
2. after each batch a real dream (`scripted:dream`, run_dream: chunks, tools, commit) reads it, and a
   scripted reviewer accepts every proposal, oldest first (one whose target changed meanwhile is
   rejected: the store refuses it as stale);
3. then it measures (bench/memory_eval_metrics.py has the rules): extraction precision, recall and
   F1 against the gold facts; citation support; duplicates; secrets proposed; stale memories still
   injected; injection recall of each question's facts under a prompt budget; the answers of a
   scripted reader that knows only its system prompt, with and without memories; and last, a memory
   is redacted and the file searched byte by byte for what it said.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .memory_eval_metrics import CONTENT_KINDS, assign, duplicates, match, norm, reader_script, strings

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "memory_eval.json"
# written in other words than FIXTURE, after the rules were (issue 26, item 3): not to be tuned to
HELD_OUT = FIXTURE.with_name("memory_eval_heldout.json")
REPO = Path(__file__).resolve().parent.parent
REVIEWER = "person:memory-eval"
READER = "scripted:reader"
BUDGET = 1000  # characters of memories in a probe session's prompt (inject_chars) for the headline figures
BUDGETS_FULL = (500, 1000, 2000, 8000)
EVERYTHING = 1_000_000


def load(quick: bool, path: Path = FIXTURE) -> list[dict[str, Any]]:
    """The fixture's samples (quick: the first)."""
    samples = json.loads(path.read_text())["samples"]
    return samples[:1] if quick else samples


def turns(sample: dict[str, Any], n: int) -> tuple[str, list[dict[str, Any]]]:
    conv = sample["conversation"]
    return conv[f"session_{n}_title"], conv[f"session_{n}"]


def model_factory(sample: dict[str, Any]) -> Any:
    """The models of a sample's host: each recorded session's scripted assistant, the reader, and the catalog's."""
    from workbench.brain.models import ModelCatalog, Reply, ScriptedModel
    from workbench.memory.dream_script import dream_script

    catalog = ModelCatalog(scripts={"dream": dream_script})

    def make(name: str) -> Any:
        if name.startswith("rec:"):
            said = [t["text"] for t in turns(sample, int(name.split(":")[1]))[1] if t["speaker"] == "assistant"]
            return ScriptedModel([Reply(text=t) for t in said], name=name)
        if name == READER:
            return ScriptedModel(reader_script, name=name)
        return catalog.make(name)

    return make


async def record(host: Any, sample: dict[str, Any], n: int) -> tuple[str, dict[str, int]]:
    """Record session n with the real brain; its id and each dia_id's event seq."""
    title, said = turns(sample, n)
    user = [t for t in said if t["speaker"] == "user"]
    sid = host.brain.create_session(title=title, model=f"rec:{n}", message=user[0]["text"])["id"]
    for t in user:
        stop = await host.brain.run_turn(sid, t["text"])
        if stop != "end_turn":
            raise RuntimeError(f"recording {sample['sample_id']} session {n} ended with {stop!r}")
    events = await host.log.aevents(sid)
    seqs = {"user": [e.seq for e in events if e.type == "user_message"],
            "assistant": [e.seq for e in events if e.type == "assistant_turn"]}
    where: dict[str, int] = {}
    for speaker in ("user", "assistant"):
        ids = [t["dia_id"] for t in said if t["speaker"] == speaker]
        if len(ids) != len(seqs[speaker]):
            raise RuntimeError(f"session {n}: {len(ids)} {speaker} turns but {len(seqs[speaker])} events")
        where.update(zip(ids, seqs[speaker], strict=True))
    return sid, where


def review_all(store: Any) -> dict[str, int]:
    """Accept every proposal, oldest first; one the store refuses as stale is rejected."""
    from workbench.errors import MemoryConflict

    out = {"accepted": 0, "rejected_stale": 0}
    for m in store.list(status="proposed", annotate=False):
        try:
            store.review(m["id"], "accept", REVIEWER)
            out["accepted"] += 1
        except MemoryConflict:
            store.review(m["id"], "reject", REVIEWER, reason="its target changed meanwhile")
            out["rejected_stale"] += 1
    return out


async def probe(host: Any, question: str) -> tuple[list[str], str]:
    """A new session asked `question` by the scripted reader: the memories injected, and its answer."""
    sid = host.brain.create_session(title="probe", model=READER, message=question)["id"]
    if await host.brain.run_turn(sid, question) != "end_turn":
        raise RuntimeError("the reader's turn did not end normally")
    events = await host.log.aevents(sid)
    injected = [m["id"] for e in events if e.type == "memories_injected" for m in e.payload["memories"]]
    answer = [b.get("text", "") for e in events if e.type == "assistant_turn"
              for b in e.payload["message"]["content"] if b.get("type") == "text"]
    return injected, "\n".join(answer)


def copies(path: Path, text: str) -> int:
    """How often text is in the raw bytes of the database file and its write-ahead log."""
    return sum(p.read_bytes().count(text.encode()) for p in (path, path.with_name(path.name + ".wal")) if p.exists())


def checkpoint(host: Any) -> None:
    host.log.write(lambda tx: tx.execute("CHECKPOINT")).result()


async def dream_over(host: Any, store: Any, sample: dict[str, Any], review: Any) -> dict[str, Any]:
    """Record the sample batch by batch, a dream and a review after each; where each dia_id went, and the dreams."""
    from workbench.memory.dream import create_dream, run_dream

    where: dict[str, tuple[str, int]] = {}
    reviews = {"accepted": 0, "rejected_stale": 0}
    dreams = []
    for batch in sample["batches"]:
        ids = []
        for n in batch:
            sid, seqs = await record(host, sample, n)
            ids.append(sid)
            where.update({d: (sid, s) for d, s in seqs.items()})
        dream_id = await asyncio.to_thread(lambda ids=ids: create_dream(host.brain, store, sessions=ids, model="scripted:dream"))
        result = await run_dream(host.brain, store, dream_id)
        if result["stop_reason"] != "end_turn":
            raise RuntimeError(f"dream over {sample['sample_id']} batch {batch} stopped: {result['stop_reason']}")
        dreams.append(dream_id)
        for k, v in (await asyncio.to_thread(review, store)).items():
            reviews[k] += v
    return {"where": where, "dreams": dreams, "reviews": reviews}


def extraction(log: Any, facts: list[dict[str, Any]], proposals: list[dict[str, Any]],
               evidence: dict[str, set[tuple[str, int]]]) -> dict[str, Any]:
    """Precision, recall, duplicates and citations of a sample's proposals against its gold facts."""
    from workbench.memory.events import event_text

    content = [p for p in proposals if p["proposal"] in CONTENT_KINDS]
    assigned = assign(content, facts, evidence)
    gold = [f for f in facts if f["class"] != "secret"]
    found = {f["id"] for f in gold if any(match(p["title"] + "\n" + p["text"], f) is not None for p in content)}
    dups = duplicates(content, assigned)

    def holds(c: dict[str, Any]) -> bool:  # the quote is in the event it cites, checked here from the log
        e = log.events(c["session_id"], after=c["seq"] - 1, until=c["seq"])
        return bool(e) and len(norm(c["quote"])) >= 8 and norm(c["quote"]) in norm(event_text(e[0]))

    matched = [p for p in content if assigned[p["id"]]]
    kinds: dict[str, int] = {}
    for p in proposals:
        kinds[p["proposal"]] = kinds.get(p["proposal"], 0) + 1
    kinds["supersedes"] = sum(1 for p in content if p["proposal"] == "create" and p["targets"])
    by_class: dict[str, list[int]] = {}
    for f in gold:
        by_class.setdefault(f["class"], [0, 0])
        by_class[f["class"]][0] += f["id"] in found
        by_class[f["class"]][1] += 1
    return {
        "gold_facts": len(gold), "proposals": len(proposals), "content_proposals": len(content), "kinds": kinds,
        "matched": len(matched), "found": len(found), "found_by_class": by_class,
        "unmatched": [p["title"] for p in content if not assigned[p["id"]]],
        "missed": sorted(f["id"] for f in gold if f["id"] not in found),
        "duplicates": len(dups), "duplicate_titles": [p["title"] for p in content if p["id"] in dups],
        "supported": sum(1 for p in proposals if p["provenance"] and all(holds(c) for c in p["provenance"])),
        "cites_gold": sum(1 for p in matched
                          if {(c["session_id"], c["seq"]) for c in p["provenance"]} & evidence[assigned[p["id"]] or ""]),
    }


async def secrets_kept_out(host: Any, secrets: list[str], dreams: list[str]) -> dict[str, int]:
    """Versions of memories (any field) holding a secret value, and the proposals the tools refused for one."""
    cur = host.log.cursor()
    try:
        rows = cur.execute("SELECT title, text, coalesce(note, ''), provenance::VARCHAR FROM memory_versions").fetchall()
    finally:
        cur.close()
    refused = 0
    for d in dreams:
        for e in await host.log.aevents(d, types=["tool_result"]):
            if e.payload.get("is_error") and "looks like a secret" in " ".join(strings(e.payload.get("content"))):
                refused += 1
    return {"secrets_proposed": sum(1 for r in rows if any(s in " ".join(r) for s in secrets)),
            "secret_proposals_refused": refused}


def right(answer: str, q: dict[str, Any]) -> bool:
    return norm(q["answer"]) in norm(answer)


async def told(host: Any, settings: Any, sample: dict[str, Any], says: Any, budgets: tuple[int, ...],
               secrets: list[str]) -> dict[str, Any]:
    """What new sessions are told: stale memories injected, injection recall under each budget, the reader's
    answers with and without memories. `says(memory id, fact)`: an accepted memory that matches the fact."""
    facts = {f["id"]: f for f in sample["facts"]}
    stale = [f for f in sample["facts"] if f["class"] == "stale"]
    questions = [q for q in sample["qa"] if not q.get("secret")]
    settings.inject_chars = EVERYTHING
    everything, _ = await probe(host, "Tell me everything you remember.")
    stale_injected = {m for m in everything for f in stale if says(m, f)}
    recall_at: dict[str, float] = {}
    answers: list[dict[str, Any]] = []
    for budget in budgets:
        settings.inject_chars = budget
        hit = 0
        for q in questions:
            injected, answer = await probe(host, q["question"])
            stale_injected |= {m for m in injected for f in stale if says(m, f)}
            hit += any(says(m, facts[fid]) for m in injected for fid in q["facts"])
            if budget == BUDGET:
                answers.append({"question": q["question"], "expected": q["answer"], "with": answer, "q": q})
        recall_at[str(budget)] = hit / len(questions)
    settings.inject_chars = BUDGET
    leaks = 0
    for q in sample["qa"]:
        if q.get("secret"):
            answer = (await probe(host, q["question"]))[1]
            leaks += any(s in answer for s in secrets)
    settings.inject = False
    for a in answers:
        a["without"] = (await probe(host, a["question"]))[1]
    settings.inject = True
    for a in answers:
        q = a.pop("q")
        a["right"] = right(a["with"], q)
        a["stale"] = bool(q.get("stale_answer")) and not a["right"] and norm(q["stale_answer"]) in norm(a["with"])
        leaks += any(s in a["with"] for s in secrets)
    return {"stale_facts": len(stale), "stale_injected": len(stale_injected), "injection_recall": recall_at,
            "questions": len(answers), "right_with": sum(a["right"] for a in answers),
            "right_without": sum(right(a["without"], {"answer": a["expected"]}) for a in answers),
            "stale_answers": sum(a["stale"] for a in answers), "secret_leaks_in_answers": leaks, "answers": answers}


async def forget(host: Any, store: Any, path: Path, fact: dict[str, Any], mid: str | None) -> dict[str, Any]:
    """Redact memory `mid` (the one saying a planted personal fact); copies of what it said in the file, before and after."""
    if mid is None:
        return {"memory_found": False}
    m = store.get(mid)
    said = m["title"] + "\n" + m["text"]
    texts = [x for x in [m["title"], *[x for x in m["text"].splitlines() if len(x) >= 16], *fact["keys"]] if x in said]
    await asyncio.to_thread(checkpoint, host)
    before = sum(copies(path, x) for x in texts)
    await asyncio.to_thread(lambda: store.review(mid, "redact", REVIEWER, reason="personal data (memory evaluation)"))
    await asyncio.to_thread(checkpoint, host)
    return {"memory_found": True, "copies_before": before, "copies_after": sum(copies(path, x) for x in texts)}


async def run_sample(sample: dict[str, Any], tmp: Path, budgets: tuple[int, ...], review: Any = review_all) -> dict[str, Any]:
    """Record, dream, review and measure one sample in a database of its own (`review`: the reviewer)."""
    from workbench.host import Host
    from workbench.memory import MemorySettings
    from workbench.memory.plugin import MemoryPlugin

    path = tmp / f"{sample['sample_id']}.duckdb"
    settings = MemorySettings(dream_order="oldest")  # a chunk's sessions in the order they were said
    plugin = MemoryPlugin(settings=settings)
    host = Host.build(path, hands=False, plugins=[plugin], model_factory=model_factory(sample))
    t0 = time.perf_counter()
    try:
        store = plugin.require_store()
        run = await dream_over(host, store, sample, review)
        seconds = time.perf_counter() - t0
        evidence = {f["id"]: {run["where"][d] for d in f["evidence"]} for f in sample["facts"]}
        memories = await asyncio.to_thread(store.list, annotate=False)
        out = {"sample": sample["sample_id"], "sessions": sum(len(b) for b in sample["batches"]),
               "dreams": len(run["dreams"]), "reviews": run["reviews"], "seconds": round(seconds, 1)}
        out.update(extraction(host.log, sample["facts"], [m for m in memories if m["dream_id"] in run["dreams"]], evidence))
        secrets = [f["secret"] for f in sample["facts"] if f["class"] == "secret"]
        out.update(secret_facts=len(secrets), **await secrets_kept_out(host, secrets, run["dreams"]))
        accepted = {m["id"]: m for m in memories if m["status"] == "accepted"}

        def says(mid: str, f: dict[str, Any]) -> bool:
            m = accepted.get(mid)
            return m is not None and match(m["title"] + "\n" + m["text"], f) is not None

        out.update(await told(host, settings, sample, says, budgets, secrets))
        target = next(f for f in sample["facts"] if f["id"] == sample["redact"])
        out["redaction"] = await forget(host, store, path, target, next((m for m in accepted if says(m, target)), None))
    finally:
        await host.close()
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def summarise(samples: list[dict[str, Any]], quick: bool) -> dict[str, Any]:
    """The figures over all samples (sums of counts, then ratios)."""
    def total(k: str) -> int:
        return sum(s[k] for s in samples)

    precision = ratio(total("matched"), total("content_proposals"))
    recall = ratio(total("found"), total("gold_facts"))
    by_class: dict[str, list[int]] = {}
    for s in samples:
        for c, (hit, n) in s["found_by_class"].items():
            by_class.setdefault(c, [0, 0])
            by_class[c][0] += hit
            by_class[c][1] += n
    kinds: dict[str, int] = {}
    for s in samples:
        for k, v in s["kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    budgets = samples[0]["injection_recall"].keys()
    red = [s["redaction"] for s in samples]
    return {
        "mode": "quick" if quick else "full",
        "samples": len(samples), "sessions": total("sessions"), "dreams": total("dreams"),
        "gold_facts": total("gold_facts"), "secret_facts": total("secret_facts"),
        "proposals": total("proposals"), "content_proposals": total("content_proposals"), "kinds": kinds,
        "precision": precision, "recall": recall,
        "f1": ratio(2 * precision * recall, precision + recall),
        "recall_by_class": {c: ratio(h, n) for c, (h, n) in sorted(by_class.items())},
        "found_by_class": {c: f"{h}/{n}" for c, (h, n) in sorted(by_class.items())},
        "citation_quotes_hold": ratio(total("supported"), total("proposals")),
        "citation_cites_gold_evidence": ratio(total("cites_gold"), total("matched")),
        "duplicate_rate": ratio(total("duplicates"), total("content_proposals")),
        "duplicates": total("duplicates"),
        "secrets_proposed": total("secrets_proposed"), "secret_proposals_refused": total("secret_proposals_refused"),
        "secret_leaks_in_answers": total("secret_leaks_in_answers"),
        "stale_facts": total("stale_facts"), "stale_injected": total("stale_injected"),
        "injection_budget": BUDGET,
        "injection_recall": {b: sum(s["injection_recall"][b] * s["questions"] for s in samples) / total("questions")
                             for b in budgets},
        "questions": total("questions"),
        "answer_accuracy_with_memories": ratio(total("right_with"), total("questions")),
        "answer_accuracy_without_memories": ratio(total("right_without"), total("questions")),
        "stale_answers": total("stale_answers"),
        "redacted_memories": sum(bool(r["memory_found"]) for r in red),
        "copies_before_redaction": sum(r.get("copies_before", 0) for r in red),
        "copies_after_redaction": sum(r.get("copies_after", 0) for r in red),
        "reviews": {k: sum(s["reviews"][k] for s in samples) for k in samples[0]["reviews"]},
        "seconds": round(sum(s["seconds"] for s in samples), 1),
        "per_sample": samples,
    }


async def evaluate(quick: bool, tmp: Path, fixture: Path = FIXTURE) -> dict[str, Any]:
    budgets = (BUDGET,) if quick else BUDGETS_FULL
    out = [await run_sample(s, tmp, budgets) for s in load(quick, fixture)]
    return summarise(out, quick)


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def markdown(r: dict[str, Any]) -> str:
    """The figures as the table docs/benchmarks.md shows."""
    goal = {True: "met", False: "**not met**"}
    rows = [
        ("extraction precision (content proposals that match a gold fact)", _pct(r["precision"]), "–"),
        ("extraction recall (gold facts some proposal matches)", _pct(r["recall"]), "–"),
        ("extraction F1", _pct(r["f1"]), "–"),
        ("recall by class", ", ".join(f"{c} {v}" for c, v in r["found_by_class"].items()), "–"),
        ("citations whose quotes are in the cited events", _pct(r["citation_quotes_hold"]), "–"),
        ("matched proposals citing their fact's gold evidence", _pct(r["citation_cites_gold_evidence"]), "–"),
        ("duplicate rate", f"{_pct(r['duplicate_rate'])} ({r['duplicates']} of {r['content_proposals']})",
         f"≤ 2 %: {goal[r['duplicate_rate'] <= 0.02]}"),
        ("secrets proposed (any version, any field)", str(r["secrets_proposed"]), f"0: {goal[r['secrets_proposed'] == 0]}"),
        ("secret proposals the tools refused", str(r["secret_proposals_refused"]), "–"),
        ("stale memories injected after the updates", f"{r['stale_injected']} (of {r['stale_facts']} stale facts)",
         f"0: {goal[r['stale_injected'] == 0]}"),
        ("copies after redaction (byte search of the file)",
         f"{r['copies_after_redaction']} (before: {r['copies_before_redaction']}, {r['redacted_memories']} memories)",
         f"0: {goal[r['copies_after_redaction'] == 0]}"),
        *[(f"injection recall, {b} characters of memories", _pct(v), "–") for b, v in r["injection_recall"].items()],
        (f"answer accuracy with memories ({r['injection_budget']} characters)",
         f"{_pct(r['answer_accuracy_with_memories'])} of {r['questions']}", "–"),
        ("answer accuracy without memories", _pct(r["answer_accuracy_without_memories"]), "–"),
        ("answers from a stale memory", str(r["stale_answers"]), "–"),
        ("secrets in the reader's answers", str(r["secret_leaks_in_answers"]), "–"),
    ]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items()) if k != "supersedes")
    kinds += f"; {r['kinds'].get('supersedes', 0)} of the creates supersede"
    head = [f"{r['samples']} samples, {r['sessions']} sessions, {r['dreams']} dreams, {r['gold_facts']} gold facts "
            f"(+{r['secret_facts']} secrets), {r['proposals']} proposals ({kinds}); reviewer: "
            f"{r['reviews']['accepted']} accepted, {r['reviews']['rejected_stale']} rejected as stale; "
            f"{r['seconds']} s.", "", "| figure | value | goal |", "|---|---|---|"]
    return "\n".join(head + [f"| {a} | {b} | {c} |" for a, b, c in rows])


SECTION = "## Memory evaluation"
END = "<!-- end of the memory evaluation -->"


def write_docs(r: dict[str, Any], path: Path) -> None:
    """Replace the "Memory evaluation" section of docs/benchmarks.md (kept after the KEPT marker)."""
    from .common import machine
    from .report import KEPT

    m = machine()
    per = "\n".join(f"- `{s['sample']}`: precision {_pct(s['matched'] / max(s['content_proposals'], 1))}, "
                    f"found {s['found']}/{s['gold_facts']}, missed {', '.join(s['missed']) or 'none'}; not matching a gold "
                    f"fact: {'; '.join(repr(t) for t in s['unmatched']) or 'none'}; duplicates: "
                    f"{'; '.join(repr(t) for t in s['duplicate_titles']) or 'none'}" for s in r["per_sample"])
    body = "\n".join([
        SECTION, "",
        f"`python -m bench.memory_eval --write-docs` ({r['started_at']}, full mode; bench/README.md describes it). "
        f"{m['cpu']}, {m['cores']} cores, Python {m['python']}, load average {m['load_average']} at the start. "
        "Counts, not timings: the figures depend on the fixture and on `scripted:dream`, not on the machine.", "",
        markdown(r), "", per, "", NOTES, END])
    old = path.read_text()
    if SECTION in old:
        start = old.index(SECTION)
        end = old.index(END, start) + len(END)
        new = old[:start] + body + old[end:]
    elif KEPT in old:
        new = old.rstrip("\n") + "\n\n" + body + "\n"
    else:
        new = old.rstrip("\n") + "\n\n" + KEPT + "\n\n" + body + "\n"
    path.write_text(new)


NOTES = """What these figures measure. `scripted:dream` is lexical (workbench/memory/dream_statements.py):
it takes as facts only the user's sentences that carry a marker ("remember", "note", "fyi", "for the record",
"always", "prefer", "never", "update:", "instead of", "forget", "no longer"), so a marker in small talk is a
false positive (the precision above: "I never got round to lunch", "let's always grab coffee") and a fact said
without one is missed (the recall above: the dashboard's refresh and the Slurm scheduler; injection recall and
the answers count every question, so those two keep them below 100 %). It relates a statement to a memory by
shared subject words (two, and 60 % of them or a shared name); every paraphrase in this fixture shares a name
or most of its words, so the duplicate rate above says little about paraphrases in other words. Those the
dream's tools catch: a new memory that is part of, more than or a paraphrase of a live one (stemmed words,
WordLlama embeddings; workbench/memory/semantic.py) is staged as an edit or merge of it, and
tests/memory/test_semantic.py shows which of its own paraphrases it merges and which facts it keeps apart;
this fixture's figures are the same with and without it. The reader answers from the memory sharing most
words with the question, the first of equals in the order of the prompt (stemmed BM25), so "Which dataframe
library should I use?" still gets the pandas memory ("use") before the polars one ("dataframes"): each shares
one word, and the pandas memory is ranked first. The gold
matching is lexical too: a memory matches a fact when it holds the fact's keys and 60 % of its content words
(bench/memory_eval_metrics.py). A real model's figures on this fixture need a cassette of a real dream; there
is none (no key here)."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.memory_eval", description="Evaluate memory and dreaming on a fixture.")
    p.add_argument("--quick", action="store_true", help="the first sample only, one budget (CI)")
    p.add_argument("--json", metavar="OUT", help="write every figure as JSON here")
    p.add_argument("--write-docs", action="store_true", help="replace the Memory evaluation section of docs/benchmarks.md")
    p.add_argument("--fixture", type=Path, default=FIXTURE,
                   help=f"the fixture to evaluate (default: {FIXTURE.name}; the held-out one: {HELD_OUT.name})")
    args = p.parse_args(argv)
    if args.write_docs and args.quick:
        p.error("--write-docs needs full mode")
    if args.write_docs and args.fixture.resolve() != FIXTURE:
        p.error("--write-docs writes the figures of the main fixture; the held-out fixture's are recorded by hand")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="workbench-memeval-") as tmp:
        os.environ["JUPYTER_RUNTIME_DIR"] = str(Path(tmp) / "runtime")
        started = datetime.now(UTC).isoformat(timespec="seconds")
        result = asyncio.run(evaluate(args.quick, Path(tmp), args.fixture))
    result["started_at"] = started
    result["command"] = "python -m bench.memory_eval" + (" --quick" if args.quick else "") + (
        f" --fixture bench/fixtures/{args.fixture.name}" if args.fixture.resolve() != FIXTURE else "")
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"[memory_eval] wrote {args.json}", file=sys.stderr)
    if args.write_docs:
        path = REPO / "docs" / "benchmarks.md"
        write_docs(result, path)
        print(f"[memory_eval] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
