#!/usr/bin/python3
"""bench_prefix.py -- prefix caching and cache-aware routing on the default
chat model (SmolLM2-135M, models/smollm2-135m-instruct-q4_1.gguf), each
part side by side in one run.

1. Multi-turn chat.  One conversation of 8 turns (a long system prompt,
   then a question per turn, each answer streamed and put back into the
   history as the model wrote it) whose prompt grows to about 1,500 tokens.
   Every turn runs twice, taking turns: on a model with the prefix cache
   (the default) and on the same model with `prefix_cache: false`, each
   alone on a worker of 2 threads.  Reported per turn: the prompt tokens,
   the tokens read from the cache, the time to the first token of both and
   their ratio.  The two runs' answers must be equal chunk by chunk (one
   chunk per token: greedy ids equal).
2. Routing.  Two replicas of the model on CPU workers of 1 thread each, 8
   conversations of 8 turns at once (each starts once the one before has
   had its first answer, as users arrive), under `routing: cache_aware`
   and under `routing: round_robin`.  Reported: the cache hit ratio (prompt
   tokens read from the cache over all prompt tokens), the time to first
   token (median and 90th percentile) and the wall time.
3. Failure.  The cache-aware run again; after its 24th answer one replica
   is killed with SIGKILL.  Reported: how long after the kill each of its
   requests ended (UNAVAILABLE), that every request got one answer, that
   the conversations on the other replica went on, and that the killed
   replica was restarted and took requests again.  A conversation whose
   turn failed sends it again.

4. The cost of batch_invariant.  The same model with and without it (no
   prefix cache, a worker of 2 threads each), taking turns 3 times: the
   time to the first token of a conversation of about 1,000 tokens (a
   prefill), and decode tokens per second over 64 tokens after it.

    /usr/bin/python3 tests/bench/bench_prefix.py [--json FILE] [--quick]

--quick: 4 turns and 4 conversations (a smoke run).  Writes
build/bench/bench_prefix.json (or --json).  Exits 1 when a request fails
unexpectedly or the two runs of part 1 answer differently; never for a
time.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_whisper as bw  # noqa: E402

bc = bw.bc
BUILD = bw.BUILD
MODEL = os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf")

SYSTEM = (
    "You are the assistant of a small public library in a coastal town. You answer the "
    "questions of visitors about books, opening hours, events and the town itself. You are "
    "friendly and precise, you keep your answers short, and you never invent facts: when you "
    "do not know something, you say so and suggest asking the staff at the front desk. The "
    "library opens at nine in the morning and closes at six in the evening from Monday to "
    "Friday, and at one in the afternoon on Saturday; it is closed on Sunday. Visitors may "
    "borrow up to eight books for three weeks, and renew them twice online or at the desk. "
    "There is a reading room on the first floor, a children's corner with picture books and "
    "games, a small collection of maps and sea charts, and four computers that anyone may use "
    "for an hour a day. Events this month: a reading club on Tuesday evenings, a talk about "
    "the history of the harbour on the second Thursday, and a workshop on repairing old books "
    "on the last Saturday. The town has a lighthouse, a fish market that opens at dawn, a "
    "museum of shipwrecks, and a long sandy beach to the south. ")

QUESTIONS = [
    "Hello! When does the library open on Saturday, and can I come on Sunday?",
    "How many books can I borrow at once, and for how long?",
    "Can you tell me more about the talk on the history of the harbour?",
    "My daughter is six. What is there for her in the library?",
    "I would like to see old sea charts. Where do I find them?",
    "Is there anything to visit in town after the library closes?",
    "How do I renew the books I borrowed last week?",
    "Thank you. Can you sum up what we talked about in two sentences?",
]
TOPICS = ["the lighthouse", "the fish market", "the museum", "the beach", "the reading club",
          "the workshop", "the computers", "the children's corner"]


def conv_question(c, t):
    """Question T of conversation C (part 2): the same shape for all, each
    conversation its own topic."""
    return "%s (I am asking about %s.)" % (QUESTIONS[t % len(QUESTIONS)], TOPICS[c % len(TOPICS)])


def config(folder, models, workers, graphs):
    return """version: 1
daemon:
  listen: ipc://%s/baton.sock
  workers_endpoint: ipc://%s/workers.sock
  request_timeout_ms: 600000
  max_inflight: 256
  log_level: warning
workers:
%s
models:
%s
graphs:
%s
""" % (folder, folder, workers, models, graphs)


def chat_graph(name, model, max_iters):
    return """  - name: %s
    inputs: [prompt]
    body:
      sequential:
        - node:
            name: prefill
            model: %s
            mode: prefill
            inputs: [prompt]
            outputs:
              - {name: token, to: decode}
              - {name: text, to: client, new_token: true, modality: text}
        - loop:
            name: decode_loop
            max_iters: %d
            body:
              node:
                name: decode
                model: %s
                mode: decode
                async: true
                inputs: [token]
                outputs:
                  - {name: token, to: decode}
                  - {name: text, to: client, new_token: true, modality: text}
""" % (name, model, max_iters, model)


class Server:
    def __init__(self, tmp, text_of):
        self.dir = tempfile.mkdtemp(prefix="baton-bench-prefix-", dir=tmp)
        self.proc, self.log, self.endpoint = bw.start_batond(self.dir, text_of(self.dir))

    def worker_pid(self, name):
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid), "-f", "--", "--name %s " % name],
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) if out else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def turn(client, graph, conv, max_tokens):
    """One streamed turn: (chunk texts, response, time to first token in s)."""
    t0 = time.perf_counter()
    first = None
    chunks = []
    for ev in client.stream(graph, messages=conv, messages_input="prompt",
                            max_iters={"decode_loop": max_tokens}):
        if ev.is_chunk:
            if first is None:
                first = time.perf_counter() - t0
            chunks.append(ev.tensor.data)
        else:
            return chunks, ev, first
    raise RuntimeError("no response")


def side_by_side(tmp, common, a, b, max_iters):
    """A batond with the model twice, each alone on a worker of 2 threads:
    graph and model A with options COMMON plus A, the same for B."""
    opts = "{path: %s, max_seq: 2048, kv_dtype: q8_0, %s%s}"
    models = "\n".join("  - {name: %s, backend: transformer, worker: w%d, max_batch: 4, "
                       "options: %s}" % (name, i, opts % (MODEL, common, extra))
                       for i, (name, extra) in enumerate((a, b)))
    workers = "\n".join("  - {name: w%d, device: cpu, pool_mb: 512, threads: 2}" % i
                        for i in range(2))
    graphs = "".join(chat_graph(name, name, max_iters) for name, _ in (a, b))
    return Server(tmp, lambda d: config(d, models, workers, graphs))


# ---- part 1 ------------------------------------------------------------------------

def part1(tmp, turns, answer_tokens):
    # batch_invariant on both: every token is computed the same way whatever
    # ran beside it or was cached, so the answers must be equal bit for bit.
    srv = side_by_side(tmp, "batch_invariant: true", ("chat", ""),
                       ("plain", ", prefix_cache: false"), answer_tokens)
    rows, ok = [], True
    try:
        with bc.Client(srv.endpoint) as c:
            # Warm both (page cache, first allocations), on another prompt.
            for g in ("chat", "plain"):
                turn(c, g, [("user", "Hi.")], 4)
            conv = [("system", SYSTEM)]
            for t in range(turns):
                conv.append(("user", QUESTIONS[t]))
                a, ra, fa = turn(c, "chat", conv, answer_tokens)
                b, rb, fb = turn(c, "plain", conv, answer_tokens)
                if not ra.ok or not rb.ok:
                    raise RuntimeError("turn %d: %s %s / %s %s" % (t + 1, ra.status, ra.message,
                                                                 rb.status, rb.message))
                same = a == b
                ok &= same
                rows.append({"turn": t + 1, "prompt_tokens": ra.usage["prompt_tokens"],
                             "cached_tokens": ra.usage["cached_tokens"],
                             "ttft_cached_s": fa, "ttft_plain_s": fb,
                             "ratio": fb / fa if fa else None, "answers_equal": same,
                             "answer_tokens": len(a)})
                conv.append(("assistant", b"".join(a).decode("utf-8", "replace")))
    finally:
        srv.stop()
    print("1. multi-turn chat: SmolLM2-135M q4_1, one worker of 2 threads each, kv q8_0")
    print("%5s %8s %8s %12s %12s %7s %6s" % ("turn", "prompt", "cached", "ttft cache",
                                             "ttft plain", "ratio", "equal"))
    for r in rows:
        print("%5d %8d %8d %10.1fms %10.1fms %6.1fx %6s" % (
            r["turn"], r["prompt_tokens"], r["cached_tokens"], r["ttft_cached_s"] * 1e3,
            r["ttft_plain_s"] * 1e3, r["ratio"], "yes" if r["answers_equal"] else "NO"))
    return rows, ok


# ---- parts 2 and 3 --------------------------------------------------------------------

def routed_server(tmp, routing, answer_tokens):
    models = ("  - {name: llm, backend: transformer, workers: [r0, r1], max_batch: 4, "
              "routing: %s, options: {path: %s, max_seq: 2048, kv_dtype: q8_0}}"
              % (routing, MODEL))
    workers = ("  - {name: r0, device: cpu, pool_mb: 512, threads: 1}\n"
               "  - {name: r1, device: cpu, pool_mb: 512, threads: 1}")
    return Server(tmp, lambda d: config(d, models, workers,
                                        chat_graph("chat", "llm", answer_tokens)))


def conversations(srv, n_conv, turns, answer_tokens, kill_after=None):
    """N_CONV conversations of TURNS turns at once (each starting once the
    one before has its first answer).  KILL_AFTER: SIGKILL replica r0 once
    that many turns have been answered.  Returns the records of every
    request and what the kill did."""
    lock = threading.Lock()
    records, started = [], [threading.Event() for _ in range(n_conv)]
    kill = {"t": None, "pid": None, "done": 0}

    def maybe_kill():
        with lock:
            kill["done"] += 1
            due = kill_after is not None and kill["t"] is None and kill["done"] >= kill_after
            if due:
                kill["pid"] = srv.worker_pid("r0")
                kill["t"] = time.perf_counter()
        if due:
            os.kill(kill["pid"], signal.SIGKILL)

    def run(ci):
        if ci:
            started[ci - 1].wait()
        with bc.Client(srv.endpoint, wait_ms=600000) as c:
            conv = [("system", SYSTEM)]
            t = 0
            while t < turns:
                conv.append(("user", conv_question(ci, t)))
                chunks, r, first = turn(c, "chat", conv, answer_tokens)
                end = time.perf_counter()
                rec = {"conv": ci, "turn": t + 1, "code": r.status, "message": r.message,
                       "end": end, "ttft_s": first,
                       "worker": next((x.worker for x in r.timings if x.node == "prefill"),
                                      None),
                       "prompt_tokens": r.usage.get("prompt_tokens", 0),
                       "cached_tokens": r.usage.get("cached_tokens", 0)}
                with lock:
                    records.append(rec)
                if not r.ok:
                    if r.status != "UNAVAILABLE":
                        raise RuntimeError("conversation %d turn %d: %s %s" % (ci, t + 1,
                                                                               r.status,
                                                                               r.message))
                    conv.pop()  # the turn failed with its replica: send it again
                    continue
                started[ci].set()
                conv.append(("assistant", b"".join(chunks).decode("utf-8", "replace")))
                t += 1
                maybe_kill()

    errors = []
    t0 = time.perf_counter()

    def guarded(i):
        try:
            run(i)
        except Exception as e:  # reported below; the others go on
            errors.append("conversation %d: %s" % (i, e))
            started[i].set()
    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n_conv)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return records, kill, time.perf_counter() - t0, errors


def summary(records, wall):
    ok = [r for r in records if r["code"] == "OK"]
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    ttft = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    return {"requests": len(records), "ok": len(ok), "prompt_tokens": prompt,
            "cached_tokens": cached, "hit_ratio": cached / prompt if prompt else 0.0,
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "ttft_p90_s": ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
            "wall_s": wall,
            "by_worker": {w: sum(1 for r in ok if r["worker"] == w) for w in ("r0", "r1")}}


def part2(tmp, n_conv, turns, answer_tokens):
    out, ok = {}, True
    for routing in ("cache_aware", "round_robin"):
        srv = routed_server(tmp, routing, answer_tokens)
        try:
            records, _, wall, errors = conversations(srv, n_conv, turns, answer_tokens)
        finally:
            srv.stop()
        for e in errors:
            print("ERROR %s: %s" % (routing, e))
        ok &= not errors and all(r["code"] == "OK" for r in records)
        out[routing] = summary(records, wall)
    print("\n2. routing: two replicas of 1 thread, %d conversations of %d turns at once"
          % (n_conv, turns))
    print("%12s %9s %9s %10s %12s %12s %9s %11s" % ("routing", "prompt", "cached", "hit ratio",
                                                    "ttft median", "ttft p90", "wall",
                                                    "r0/r1"))
    for routing, s in out.items():
        print("%12s %9d %9d %10.3f %10.0fms %10.0fms %8.1fs %5d/%-5d" % (
            routing, s["prompt_tokens"], s["cached_tokens"], s["hit_ratio"],
            s["ttft_median_s"] * 1e3, s["ttft_p90_s"] * 1e3, s["wall_s"],
            s["by_worker"]["r0"], s["by_worker"]["r1"]))
    return out, ok


def part3(tmp, n_conv, turns, answer_tokens, kill_after):
    srv = routed_server(tmp, "cache_aware", answer_tokens)
    try:
        records, kill, wall, errors = conversations(srv, n_conv, turns, answer_tokens,
                                                    kill_after)
        restarted = srv.worker_pid("r0")
    finally:
        srv.stop()
    failed = [r for r in records if r["code"] != "OK"]
    after = [r for r in records if kill["t"] and r["end"] > kill["t"] and r["code"] == "OK"]
    res = {"killed_pid": kill["pid"], "restarted_pid": restarted,
           "unavailable": len(failed),
           "unavailable_after_kill_s": [r["end"] - kill["t"] for r in failed],
           "other_codes": sorted({r["code"] for r in failed} - {"UNAVAILABLE"}),
           "answers": len(records), "conversations_done": n_conv - len(errors),
           "ok_after_kill_on_r0": sum(1 for r in after if r["worker"] == "r0"),
           "ok_after_kill_on_r1": sum(1 for r in after if r["worker"] == "r1"),
           "errors": errors, "wall_s": wall}
    ok = (not errors and not res["other_codes"] and res["restarted_pid"] not in
          (None, kill["pid"]))
    print("\n3. failure: r0 killed (SIGKILL) after %d answers, cache-aware" % kill_after)
    print("   %d requests of r0 ended UNAVAILABLE, %s after the kill; every request answered "
          "once (%d answers), %d of %d conversations finished" % (
              res["unavailable"], ", ".join("%.3fs" % s for s in res["unavailable_after_kill_s"])
              or "-", res["answers"], res["conversations_done"], n_conv))
    print("   after the kill: %d turns answered on r1, %d on r0 (restarted: pid %s -> %s)"
          % (res["ok_after_kill_on_r1"], res["ok_after_kill_on_r0"], kill["pid"], restarted))
    return res, ok


def part4(tmp, rounds):
    srv = side_by_side(tmp, "prefix_cache: false", ("fast", ""),
                       ("inv", ", batch_invariant: true"), 64)
    conv = [("system", SYSTEM)]
    for t, q in enumerate(QUESTIONS):
        conv += [("user", q), ("assistant", QUESTIONS[(t + 3) % len(QUESTIONS)] * 6)]
    conv = conv[:-1]
    got = {"fast": [], "inv": []}
    try:
        with bc.Client(srv.endpoint, wait_ms=600000) as c:
            for g in got:
                turn(c, g, [("user", "Hi.")], 4)
            for _ in range(rounds):
                for g in got:
                    t0 = time.perf_counter()
                    chunks, r, first = turn(c, g, conv, 64)
                    total = time.perf_counter() - t0
                    if not r.ok:
                        raise RuntimeError("%s: %s %s" % (g, r.status, r.message))
                    got[g].append({"prompt_tokens": r.usage["prompt_tokens"], "ttft_s": first,
                                   "decode_tok_s": (len(chunks) - 1) / (total - first)})
    finally:
        srv.stop()
    res = {g: {"prompt_tokens": v[0]["prompt_tokens"],
               "ttft_median_s": statistics.median(x["ttft_s"] for x in v),
               "decode_tok_s_median": statistics.median(x["decode_tok_s"] for x in v)}
           for g, v in got.items()}
    print("\n4. the cost of batch_invariant (2 threads, no prefix cache, %d rounds)" % rounds)
    print("%18s %8s %12s %12s" % ("", "prompt", "prefill", "decode"))
    for g, name in (("fast", "default"), ("inv", "batch_invariant")):
        x = res[g]
        print("%18s %8d %10.0fms %8.1ftok/s" % (name, x["prompt_tokens"], x["ttft_median_s"] * 1e3,
                                               x["decode_tok_s_median"]))
    print("%18s %8s %11.2fx %11.2fx" % ("invariant/default", "",
                                       res["inv"]["ttft_median_s"] / res["fast"]["ttft_median_s"],
                                       res["inv"]["decode_tok_s_median"] /
                                       res["fast"]["decode_tok_s_median"]))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(BUILD, "bench", "bench_prefix.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", type=int, default=0, help="run only this part (1 to 4)")
    a = ap.parse_args()
    if not os.path.exists(MODEL):
        print("SKIP bench_prefix: %s is absent (scripts/fetch-model.sh)" % MODEL)
        return 0
    turns = 4 if a.quick else 8
    n_conv = 4 if a.quick else 8
    tmp = tempfile.mkdtemp(prefix="baton-bench-prefix-")
    report, ok = {}, True
    if a.part in (0, 1):
        report["multi_turn"], k = part1(tmp, turns, 150)
        ok &= k
    if a.part in (0, 2):
        report["routing"], k = part2(tmp, n_conv, turns, 32)
        ok &= k
    if a.part in (0, 3):
        report["failure"], k = part3(tmp, n_conv, turns, 32, n_conv * turns // 3)
        ok &= k
    if a.part in (0, 4):
        report["invariant_cost"] = part4(tmp, 1 if a.quick else 3)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    print("\nwrote %s" % a.json)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
