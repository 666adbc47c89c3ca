"""End-to-end checks of `kvmesh serve` over a real loopback socket (run by serve_test.sh).

usage: serve_test.py BASE_URL MODE   (MODE: main | auth KEY | limits | overload | choices |
                                      reuse on|off | concurrent | stalled-reader RPC_PORT)
"""
import json
import os
import re
import sys
import threading
import urllib.error
import urllib.request

base, mode = sys.argv[1], sys.argv[2]


def call(method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def metrics_text():
    code, text, _ = call("GET", "/metrics", headers=HDR)
    check(code == 200, f"/metrics {code}")
    return text


def metric(name):
    for line in metrics_text().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    sys.exit(f"FAIL: metric {name} missing")


def http_responses(code):
    """kvmesh:http_responses_total for one status code (0 before its first response)."""
    for line in metrics_text().splitlines():
        m = re.match(r'kvmesh:http_responses_total\{.*,code="(\d+)"\} (\S+)$', line)
        if m and m.group(1) == code:
            return float(m.group(2))
    return 0.0


def per_replica(name):
    """A per-replica metric (under --dp): its values by replica index."""
    got = {}
    for line in metrics_text().splitlines():
        m = re.match(name + r'\{.*,replica="(\d+)"\} (\S+)$', line)
        if m:
            got[int(m.group(1))] = float(m.group(2))
    return [got[r] for r in sorted(got)]


def wait_for(name, value):
    """Waits (up to 60 s) for a metric to read `value`."""
    import time
    deadline = time.time() + 60
    while metric(name) != value:
        check(time.time() < deadline, f"{name} never reached {value}")
        time.sleep(0.01)


def count_to(results, max_tokens):
    """A greedy "Count:" completion of max_tokens tokens; appends (code, body, max_tokens)."""
    code, body, _ = call("POST", "/v1/completions",
                         {"prompt": "Count:", "max_tokens": max_tokens, "ignore_eos": True,
                          "temperature": 0})
    results.append((code, body, max_tokens))


def one_running_one_waiting(results, long_tokens, short_tokens):
    """On a server of one running sequence: a count_to of long_tokens running and one of
    short_tokens waiting behind it, each stage waited for on the gauges; their threads."""
    threads = [threading.Thread(target=count_to, args=(results, long_tokens))]
    threads[0].start()
    wait_for("kvmesh:num_requests_running", 1)
    threads.append(threading.Thread(target=count_to, args=(results, short_tokens)))
    threads[1].start()
    wait_for("kvmesh:num_requests_waiting", 1)
    return threads


HDR = {}
chat = lambda msgs, **kw: {"messages": msgs, "temperature": 0, "max_tokens": 24, **kw}

if mode == "main":
    code, body, _ = call("GET", "/health")
    check(code == 200 and json.loads(body)["status"] == "ok", "health")
    code, body, _ = call("GET", "/v1/models")
    check(code == 200 and json.loads(body)["data"][0]["id"], "models")
    # Non-streamed chat: the greedy answer.
    code, body, _ = call("POST", "/v1/chat/completions",
                         chat([{"role": "user", "content": "What is the capital of France?"}]))
    check(code == 200, f"chat {code} {body}")
    r = json.loads(body)
    check("Paris" in r["choices"][0]["message"]["content"], f"answer: {body}")
    check(r["usage"]["prompt_tokens"] > 0 and r["choices"][0]["finish_reason"] == "stop", body)
    # Streamed: the concatenated deltas equal the non-streamed text; its 200 is counted (as is
    # the scrape before it: a scrape counts once its answer has gone out).
    ok_before = http_responses("200")
    code, body, hdrs = call("POST", "/v1/chat/completions",
                            chat([{"role": "user", "content": "What is the capital of France?"}],
                                 stream=True, stream_options={"include_usage": True}))
    check(code == 200 and hdrs.get("Content-Type", "").startswith("text/event-stream"), "SSE header")
    events = [l[6:] for l in body.split("\n") if l.startswith("data: ")]
    check(events[-1] == "[DONE]", "stream ends with [DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    check(text == r["choices"][0]["message"]["content"], f"stream text {text!r}")
    check(chunks[-1]["usage"]["completion_tokens"] == r["usage"]["completion_tokens"], "usage")
    ok_after = http_responses("200")
    check(ok_after == ok_before + 2, f"200s {ok_before} -> {ok_after}")
    # Log-probabilities: the greedy token is the most likely one; top alternatives descend.
    code, body, _ = call("POST", "/v1/chat/completions",
                         chat([{"role": "user", "content": "What is the capital of France?"}],
                              logprobs=True, top_logprobs=3, max_tokens=4))
    check(code == 200, f"logprobs {code} {body}")
    for e in json.loads(body)["choices"][0]["logprobs"]["content"]:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        check(len(tops) == 3 and e["token"] == e["top_logprobs"][0]["token"] and
              abs(e["logprob"] - tops[0]) < 1e-6 and tops == sorted(tops, reverse=True) and
              e["logprob"] <= 0, f"logprobs entry {e}")
    # Completions.
    code, body, _ = call("POST", "/v1/completions",
                         {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 4})
    check(code == 200 and json.loads(body)["choices"][0]["text"].strip().startswith("Paris"), body)
    # A control token mid-answer (ignore_eos past <|im_end|>): listed in logprobs by its name,
    # left out of the text, and adding nothing to the text_offset of the tokens after it.
    code, body, _ = call("POST", "/v1/completions", {
        "prompt": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                  "<|im_start|>assistant\n", "temperature": 0, "max_tokens": 24,
        "ignore_eos": True, "logprobs": 1})
    c = json.loads(body)["choices"][0]
    toks, offs = c["logprobs"]["tokens"], c["logprobs"]["text_offset"]
    ctl = [i for i, t in enumerate(toks) if re.fullmatch(r"<\|[a-z_]+\|>", t)]
    check(code == 200 and ctl and toks[ctl[0]] == "<|im_end|>" and ctl[0] + 1 < len(toks),
          f"no <|im_end|> mid-answer: {toks}")
    check("<|im_" not in c["text"], f"control token in the text: {c['text']!r}")
    plain = [t for i, t in enumerate(toks) if i not in ctl]
    check(offs == [len("".join(t for j, t in enumerate(toks[:i]) if j not in ctl))
                   for i in range(len(toks))] and "".join(plain) == c["text"],
          f"text_offset {offs} for {toks}")
    # A multi-turn session over a document: the prefix-cache hit counter rises every turn.
    doc = " ".join(f"Item {i} is kept on shelf {i % 4}." for i in range(1, 40))
    msgs = [{"role": "user", "content": doc + " Where is item 9?"}]
    hits = [metric("kvmesh:prefix_cache_hits_total")]
    cached = []
    for q in ["And item 14?", "And item 33?"]:
        code, body, _ = call("POST", "/v1/chat/completions", chat(msgs, session_id="s1"))
        check(code == 200, f"session turn {code}")
        r = json.loads(body)
        cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
        hits.append(metric("kvmesh:prefix_cache_hits_total"))
        msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                 {"role": "user", "content": q}]
    code, body, _ = call("POST", "/v1/chat/completions", chat(msgs, session_id="s1"))
    r = json.loads(body)
    cached.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
    hits.append(metric("kvmesh:prefix_cache_hits_total"))
    check(cached[1] > 300 and cached[2] > cached[1], f"cached tokens per turn {cached}")
    check(hits[2] > hits[1] and hits[3] > hits[2], f"hit counter {hits}")
    check(metric("kvmesh:time_to_first_token_seconds_count") >= 6, "TTFT histogram")
    # A request's first token ends its prefill: one observation each; every one was queued first.
    ttft_n = metric("kvmesh:time_to_first_token_seconds_count")
    check(metric("kvmesh:request_prefill_time_seconds_count") == ttft_n and
          metric("kvmesh:request_queue_time_seconds_count") >= ttft_n, "queue / prefill histograms")
    # Malformed input: 4xx, and the server keeps serving; /metrics counts the answers by code.
    answered = {c: http_responses(c) for c in ("400", "404")}
    for path, raw, want in [("/v1/chat/completions", b"{bad", 400),
                            ("/v1/chat/completions", b'{"messages": []}', 400),
                            ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400),
                            ("/v1/completions", b'{"prompt": 1}', 400),
                            ("/v1/completions", b'{"prompt": "x", "n": 99}', 400),
                            ("/v1/completions", b'{"prompt": "x", "max_tokens": 9000}', 400),
                            ("/v1/completions", b'{"prompt": "x", "temperature": -1}', 400),
                            ("/v1/nothing", b"{}", 404)]:
        code, body, _ = call("POST", path, raw=raw)
        check(code == want and "error" in json.loads(body), f"{path} {raw!r}: {code} {body}")
    now = {c: http_responses(c) for c in ("400", "404")}
    check(now["400"] == answered["400"] + 7 and now["404"] == answered["404"] + 1,
          f"http_responses_total by code {answered} -> {now}")
    # The context error in vLLM's words (clients match them to trim a conversation), its param.
    code, body, _ = call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 8192})
    err = json.loads(body)["error"]
    check(code == 400 and err["message"].startswith("This model's maximum context length is 8192")
          and err["param"] == "prompt", f"context error: {body}")
    # Also for a max_tokens far past the context (it was refused as out of a range).
    code, body, _ = call("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000})
    err = json.loads(body)["error"]
    check(code == 400 and err["message"].startswith("This model's maximum context length is 8192")
          and err["param"] == "messages", f"context error past the context: {body}")
    code, body, _ = call("POST", "/v1/completions", {"prompt": "x", "n": 0})
    check(json.loads(body)["error"]["param"] == "n", f"param of a bad field: {body}")
    # Only the served model: another is 404 (vLLM's message), the served one is echoed.
    name = json.loads(call("GET", "/v1/models")[1])["data"][0]["id"]
    code, body, _ = call("POST", "/v1/completions", {"prompt": "x", "model": "gpt-4o", "max_tokens": 1})
    check(code == 404 and "`gpt-4o` does not exist" in json.loads(body)["error"]["message"], body)
    code, body, _ = call("GET", "/v1/models/" + name)
    check(code == 200 and json.loads(body)["id"] == name, f"/v1/models/{name}: {code} {body}")
    check(call("GET", "/v1/models/gpt-4o")[0] == 404, "/v1/models/gpt-4o")
    # A prompt as token ids gives what its text gives.
    by_text = call("POST", "/v1/completions", {"prompt": "The capital of France is", "model": name,
                                               "temperature": 0, "max_tokens": 6})
    check(by_text[0] == 200 and json.loads(by_text[1])["model"] == name, by_text[1])
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is" in SmolLM2's vocabulary
    by_ids = call("POST", "/v1/completions", {"prompt": ids, "temperature": 0, "max_tokens": 6})
    check(by_ids[0] == 200 and json.loads(by_ids[1])["choices"][0]["text"]
          == json.loads(by_text[1])["choices"][0]["text"], f"token-id prompt: {by_ids[1]} {by_text[1]}")
    code, _, _ = call("GET", "/v1/chat/completions")
    check(code == 405, f"GET on a POST route: {code}")
    code, _, _ = call("GET", "/health")
    check(code == 200, "still serving after bad requests")
    print(f"serve main: chat, stream, completions, session cached {cached}, hits {hits}, errors ok")
    import time
    # Stop sequences: the text ends before the first one, finish_reason "stop", streamed alike
    # (text that could begin a stop sequence is held back until it cannot).
    plain = {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 24,
             "ignore_eos": True}
    code, body, _ = call("POST", "/v1/completions", plain)
    full = json.loads(body)["choices"][0]["text"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    check(len(stop) == 3, f"a stop string from {full!r}")
    want = full[:full.index(stop)]
    code, body, _ = call("POST", "/v1/completions", dict(plain, stop=[stop, "never-in-text"]))
    got = json.loads(body)["choices"][0]
    check(code == 200 and got["text"] == want and got["finish_reason"] == "stop",
          f"stop {stop!r}: {got} vs {want!r}")
    code, body, _ = call("POST", "/v1/completions", dict(plain, stop=stop, stream=True))
    events = [json.loads(l[6:]) for l in body.split("\n")
              if l.startswith("data: ") and l != "data: [DONE]"]
    streamed = "".join(e["choices"][0]["text"] for e in events)
    check(streamed == want and events[-1]["choices"][0]["finish_reason"] == "stop",
          f"streamed stop {stop!r}: {streamed!r} vs {want!r}")
    # ... and the request finishes as a success, not a cancel.
    ok0, cancelled0 = metric("kvmesh:request_success_total"), metric("kvmesh:request_cancelled_total")
    code, body, _ = call("POST", "/v1/completions", dict(plain, stop=stop))
    usage = json.loads(body)["usage"]
    # (/metrics is published before each answer goes out: counted by the time it arrives.)
    check(metric("kvmesh:request_success_total") == ok0 + 1 and
          metric("kvmesh:request_cancelled_total") == cancelled0,
          "a stop sequence is a success: success %s -> %s, cancelled %s -> %s" % (
              ok0, metric("kvmesh:request_success_total"), cancelled0,
              metric("kvmesh:request_cancelled_total")))
    check(0 < usage["completion_tokens"] < 24, f"tokens up to the stop: {usage}")
    print(f"serve main: stop sequence {stop!r} ends the text, streamed and not")
    # n choices of one prompt. Greedy: n copies of the one answer, usage counting each.
    code, body, _ = call("POST", "/v1/completions", dict(plain, max_tokens=8))
    one = json.loads(body)
    code, body, _ = call("POST", "/v1/completions", dict(plain, max_tokens=8, n=3))
    three = json.loads(body)
    check(code == 200 and [c["index"] for c in three["choices"]] == [0, 1, 2] and
          all(c["text"] == one["choices"][0]["text"] for c in three["choices"]),
          f"greedy n=3: {body} vs {one}")
    check(three["usage"]["completion_tokens"] == 3 * one["usage"]["completion_tokens"] and
          three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"], f"n=3 usage {body}")
    # Sampled with a seed: choice i is what n=1 gives with seed + i (so choices differ and
    # repeat), streamed alike, each choice's chunks by its index.
    sampled = {"prompt": "Once upon a time", "temperature": 1.0, "max_tokens": 12,
               "ignore_eos": True, "seed": 11}
    code, body, _ = call("POST", "/v1/completions", dict(sampled, n=3))
    texts = [c["text"] for c in json.loads(body)["choices"]]
    alone = [json.loads(call("POST", "/v1/completions", dict(sampled, seed=11 + i))[1])
             ["choices"][0]["text"] for i in range(3)]
    check(code == 200 and texts == alone and len(set(texts)) > 1,
          f"seeded n=3 {texts} vs one at a time {alone}")
    code, body, _ = call("POST", "/v1/chat/completions",
                         chat([{"role": "user", "content": "Name a colour."}], n=2,
                              temperature=1.0, seed=5, stream=True,
                              stream_options={"include_usage": True}))
    events = [l[6:] for l in body.split("\n") if l.startswith("data: ")]
    check(code == 200 and events[-1] == "[DONE]", f"n=2 stream: {body[-200:]}")
    chunks = [json.loads(e) for e in events[:-1]]
    got = {0: "", 1: ""}
    finishes = {0: 0, 1: 0}
    for c in chunks[:-1]:
        (ch,) = c["choices"]
        got[ch["index"]] += ch["delta"].get("content", "")
        finishes[ch["index"]] += ch["finish_reason"] is not None
    code, body, _ = call("POST", "/v1/chat/completions",
                         chat([{"role": "user", "content": "Name a colour."}], n=2,
                              temperature=1.0, seed=5))
    whole = json.loads(body)
    check([got[0], got[1]] == [c["message"]["content"] for c in whole["choices"]] and
          finishes == {0: 1, 1: 1}, f"n=2 streamed {got} {finishes} vs {body}")
    check(chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"],
          f"n=2 stream usage {chunks[-1]}")
    # The choices share the prompt's KV blocks: n=4 over a fresh prompt of many full blocks
    # finds them cached for the choices after the first (under --dp 2 too: the choices run on
    # the first one's replica, whose cache holds the prompt).
    fresh = " ".join(f"Box {i} holds {i * 7 % 13} marbles." for i in range(60))
    hits0 = metric("kvmesh:prefix_cache_hits_total")
    code, body, _ = call("POST", "/v1/completions",
                         {"prompt": fresh, "temperature": 0, "max_tokens": 2, "n": 4})
    n_prompt = json.loads(body)["usage"]["prompt_tokens"]
    shared = metric("kvmesh:prefix_cache_hits_total") - hits0
    check(code == 200 and shared >= 3 * (n_prompt // 16 - 1) * 16,
          f"n=4 over a {n_prompt}-token prompt: {shared} tokens from the cache")
    print(f"serve main: n choices (greedy copies, seeded = one at a time, streamed by index, "
          f"{shared:.0f} prompt tokens shared by 4 choices)")
    # Two requests for the same fresh document at once: the second finds the first's blocks. Under
    # --dp too: the second is routed to the replica that knows the prompt, queued, being computed
    # or cached there (serving/router.h); before that router a loaded CI run sent the pair to two
    # replicas (0 tokens shared).
    fresh2 = " ".join(f"Crate {i} holds {i * 5 % 11} lemons." for i in range(60))
    hits0 = metric("kvmesh:prefix_cache_hits_total")
    got = []
    pair = [threading.Thread(target=lambda: got.append(call(
        "POST", "/v1/completions", {"prompt": fresh2, "temperature": 0, "max_tokens": 2})))
        for _ in range(2)]
    for t in pair:
        t.start()
    for t in pair:
        t.join()
    n_prompt = json.loads(got[0][1])["usage"]["prompt_tokens"]
    shared = metric("kvmesh:prefix_cache_hits_total") - hits0
    check([g[0] for g in got] == [200, 200], f"two requests at once: {got}")
    check(shared >= (n_prompt // 16 - 1) * 16,
          f"two requests at once over a {n_prompt}-token prompt: {shared} tokens from the cache")
    print(f"serve main: two requests at once over one fresh prompt share {shared:.0f} tokens")
    # Under --dp (SERVE_TEST_DP): a chat request that shares only its first block (the template
    # and the start of a fresh system prompt) with a request running on one replica goes to the
    # idle one, by load (serving/router.h); routed by cached prefix alone it followed the running
    # one and read that block from its cache.
    if os.environ.get("SERVE_TEST_DP", "1") == "1":
        check("kvmesh:replica_" not in metrics_text(), "per-replica series with one replica")
    elif os.environ["SERVE_TEST_DP"] == "2":
        import time
        routed0 = per_replica("kvmesh:replica_requests_total")
        check(len(routed0) == 2, f"per-replica requests: {routed0}")
        # ~20 tokens with the template's: the first block is shared, the second holds the user's.
        system = {"role": "system", "content": f"Be brief, run {time.time_ns() % 10**6:06d}."}
        running = []
        t = threading.Thread(target=lambda: running.append(call("POST", "/v1/chat/completions", chat(
            [system, {"role": "user", "content": "Count to a thousand."}], max_tokens=500,
            ignore_eos=True))))
        t.start()
        wait_for("kvmesh:num_requests_running", 1)
        short = "Name a colour, a fruit, a bird and a tree, in four words, please."
        code, body, _ = call("POST", "/v1/chat/completions", chat(
            [system, {"role": "user", "content": short}], max_tokens=2))
        t.join()
        check(code == 200 and running[0][0] == 200, f"beside a running request: {code} {body}")
        usage = json.loads(body)["usage"]
        check(usage["prompt_tokens_details"]["cached_tokens"] == 0,
              f"beside a running request with the same first block: {usage} (same replica)")
        routed = per_replica("kvmesh:replica_requests_total")
        check([b - a for a, b in zip(routed0, routed)] == [1, 1],
              f"the two requests per replica: {routed0} -> {routed}")
        print(f"serve main: a {usage['prompt_tokens']}-token chat prompt sharing one block with a "
              f"running request went to the idle replica (requests per replica {routed})")
    # Three keep-alive requests on one connection, the second pipelined behind the first and the
    # third sent while the second runs: all three are answered (two hang-up watches, one left
    # over from the first request, once raced for the third's bytes and closed the connection).
    import socket as _s, urllib.parse as _u
    uu = _u.urlparse(base)
    one = json.dumps({"prompt": "Count:", "max_tokens": 40, "ignore_eos": True,
                      "temperature": 0}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(one), one))
    c = _s.create_connection((uu.hostname, uu.port), timeout=60)
    c.sendall(req + req)
    got, answers = b"", 0
    while answers < 3:
        chunk = c.recv(65536)
        check(chunk, f"connection closed after {answers} answers")
        got += chunk
        n = got.count(b"HTTP/1.1 200")
        if n > answers:
            answers = n
            if answers == 1:
                time.sleep(0.1)
                c.sendall(req)  # while the second runs
    c.close()
    print("serve main: three pipelined keep-alive requests all answered")
    # A huge prompt is tokenised off the io thread: /health keeps answering while it is. 2 MB
    # of distinct words (seconds on a slow core, ~0.5 s on a fast one; the request then fails as
    # too long for the context) while /health is asked every 20 ms: on the io thread, the probe
    # in flight when tokenising began waited for it to end.
    import random, select, time
    rnd = random.Random(7)
    words = " ".join("".join(rnd.choice("abcdefghijklmnopqrstuvwxyz")
                             for _ in range(rnd.randint(3, 12))) for _ in range(200000))
    body = json.dumps({"prompt": words[:1900000], "max_tokens": 1}).encode()
    bs = _s.create_connection((uu.hostname, uu.port), timeout=60)
    bs.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    sent = time.time()
    waits = []
    while not select.select([bs], [], [], 0.02)[0]:
        t = time.time()
        check(call("GET", "/health")[0] == 200, "health while a huge prompt is tokenised")
        waits.append(time.time() - t)
    answered = time.time() - sent
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = bs.recv(65536)
        check(chunk, "huge prompt: connection closed")
        got += chunk
    bs.close()
    check(got.startswith(b"HTTP/1.1 400"), f"huge prompt: {got[:60]!r}")
    if answered < 0.3:
        print(f"serve main: SKIPPED the /health-while-tokenising check: the 2 MB prompt took only "
              f"{answered:.2f} s here, too short to tell a blocked io thread from a free one")
    else:
        check(max(waits) < 0.15, f"/health waited {max(waits):.2f} s while a {answered:.2f} s "
              f"prompt was tokenised")
        print(f"serve main: /health answered in at most {max(waits) * 1000:.0f} ms while a 2 MB "
              f"prompt was tokenised ({answered:.2f} s)")
    # "Expect: 100-continue": the interim reply comes before the body is sent.
    import socket, urllib.parse
    u = urllib.parse.urlparse(base)
    body = json.dumps({"prompt": "Hi", "temperature": 0, "max_tokens": 2}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    interim = s.recv(4096)
    check(interim.startswith(b"HTTP/1.1 100 Continue"), f"100-continue: {interim!r}")
    s.sendall(body)
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    s.close()
    check(reply.startswith(b"HTTP/1.1 200"), f"after 100-continue: {reply[:200]!r}")
    print("serve main: Expect: 100-continue answered before the body")
    # A client that sends a pipelined request behind a long one and then hangs up: the long one
    # is cancelled (the pipelined bytes did not end the watch for the hang-up).
    import socket, time, urllib.parse
    u = urllib.parse.urlparse(base)
    before = metric("kvmesh:request_cancelled_total")
    body = json.dumps({"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True,
                       "temperature": 0}).encode()
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)
    s.close()
    for _ in range(100):
        if metric("kvmesh:request_cancelled_total") > before:
            break
        time.sleep(0.1)
    check(metric("kvmesh:request_cancelled_total") > before, "hang-up after a pipelined request")
    print("serve main: a hang-up after pipelined bytes cancels the request")
    # A client that hangs up on a streamed n=3 request: all three choices are cancelled.
    before = metric("kvmesh:request_cancelled_total")
    body = json.dumps({"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True, "n": 3,
                       "stream": True}).encode()
    s = socket.create_connection((u.hostname, u.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    first = s.recv(4096)
    check(first.startswith(b"HTTP/1.1 200"), f"n=3 stream: {first[:80]!r}")
    s.close()
    for _ in range(100):
        if metric("kvmesh:request_cancelled_total") >= before + 3:
            break
        time.sleep(0.1)
    check(metric("kvmesh:request_cancelled_total") == before + 3,
          f"hang-up on n=3: cancelled {before} -> {metric('kvmesh:request_cancelled_total')}")
    print("serve main: a hang-up on a streamed n=3 request cancels its three choices")

elif mode == "auth":
    key = sys.argv[3]
    check(call("GET", "/health")[0] == 200, "health needs no key")
    for path, body in [("/v1/models", None), ("/metrics", None),
                       ("/v1/chat/completions", chat([{"role": "user", "content": "hi"}]))]:
        method = "POST" if body else "GET"
        check(call(method, path, body)[0] == 401, f"{path} without a key")
        check(call(method, path, body, {"Authorization": "Bearer wrong"})[0] == 401, f"{path} wrong key")
        check(call(method, path, body, {"Authorization": "Bearer " + key})[0] == 200, f"{path} right key")
    print("serve auth: every route but /health needs the key")

elif mode == "limits":
    code, body, _ = call("POST", "/v1/completions", raw=b'{"prompt": "' + b"x" * 5000 + b'"}')
    check(code == 413, f"oversized body: {code}")
    check(call("GET", "/health")[0] == 200, "still serving after an oversized body")
    # Without max_tokens a request may run to what the context leaves, within what this small KV
    # pool (--kv-cache-mem 4: far below one 8K context) holds for it alone: not refused.
    HDR = {"Authorization": "Bearer " + sys.argv[3]}
    code, body, _ = call("POST", "/v1/completions", {"prompt": "Count:", "ignore_eos": True,
                                                     "temperature": 0}, HDR)
    check(code == 200, f"no max_tokens with a small pool: {code} {body}")
    u = json.loads(body)["usage"]
    check(json.loads(body)["choices"][0]["finish_reason"] == "length" and
          16 < u["prompt_tokens"] + u["completion_tokens"] < 1024, f"no max_tokens: {body}")
    print(f"serve limits: oversized body -> 413; no max_tokens -> {u['completion_tokens']} tokens "
          f"(the pool's room)")

elif mode == "choices":
    # max_num_seqs 1, max_waiting 2: n is at most 2 (the choices queue together). With one
    # request running and one waiting, an n=2 request's first choice takes the last place in the
    # queue and its second is refused: 429 alone, the first choice cancelled, the others served.
    code, body, _ = call("POST", "/v1/completions", {"prompt": "x", "n": 3})
    check(code == 400 and json.loads(body)["error"]["param"] == "n", f"n=3 over 2: {code} {body}")
    results = []
    threads = one_running_one_waiting(results, 600, 8)  # the 600 outlasts the rest
    code, body, _ = call("POST", "/v1/completions", {"prompt": "Count:", "max_tokens": 8, "n": 2})
    check(code == 429, f"n=2 with one place left: {code} {body}")
    wait_for("kvmesh:request_cancelled_total", 1)
    wait_for("kvmesh:request_rejected_total", 1)
    wait_for("kvmesh:num_requests_waiting", 1)
    for t in threads:
        t.join()
    check(sorted((c, m) for c, _, m in results) == [(200, 8), (200, 600)],
          f"the others: {results}")
    print("serve choices: n above the queue -> 400; a refused choice -> 429, its sibling "
          "cancelled, the others served")

elif mode == "overload":
    # One running sequence (max_num_seqs 1) and one waiting (max_waiting 1): with a long request
    # running and a second queued behind it, every further request is refused with 429 at once,
    # and the two admitted ones complete. Each stage waits for the server's gauges: 8 requests
    # sent at once raced the scheduler (under load all 8 could arrive while the first was still
    # queued, and then it alone was admitted).
    results = []
    threads = one_running_one_waiting(results, 512, 16)  # the 512 outlasts the rest
    threads += [threading.Thread(target=count_to, args=(results, 16)) for _ in range(6)]
    for t in threads[2:]:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(c for c, _, _ in results)
    check(codes == [200, 200] + [429] * 6, f"overload codes {codes}")
    for c, body, max_tokens in results:
        if c == 200:
            check(json.loads(body)["usage"]["completion_tokens"] == max_tokens,
                  "admitted requests complete")
    print(f"serve overload: codes {codes}")

elif mode == "reuse":
    # Whether prefix reuse is on (argv[3]: on | off): the same prompt twice.
    msgs = [{"role": "user", "content": " ".join(f"Fact {i}: the sky is blue." for i in range(30))}]
    cached = []
    for _ in range(2):
        code, body, _ = call("POST", "/v1/chat/completions", chat(msgs, max_tokens=1))
        check(code == 200, f"reuse {code} {body}")
        cached.append(json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"])
    check(cached[1] > 100 if sys.argv[3] == "on" else cached == [0, 0],
          f"prefix reuse {sys.argv[3]}: cached tokens {cached}")
    print(f"serve prefix reuse {sys.argv[3]}: cached tokens {cached}")

elif mode == "concurrent":
    # Different requests answered one at a time, then all at once (batched; with pipeline
    # stages, in overlapping steps): the same greedy texts.
    prompts = [f"Write a list of {n} animals:" for n in (3, 4, 5, 6)]
    body = lambda p: {"prompt": p, "max_tokens": 24, "ignore_eos": True, "temperature": 0}
    alone = []
    for p in prompts:
        code, text, _ = call("POST", "/v1/completions", body(p))
        check(code == 200, f"alone {code}")
        alone.append(json.loads(text)["choices"][0]["text"])
    together = [None] * len(prompts)

    def one(i):
        code, text, _ = call("POST", "/v1/completions", body(prompts[i]))
        together[i] = json.loads(text)["choices"][0]["text"] if code == 200 else f"HTTP {code}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(together == alone, f"concurrent answers differ: {together} vs {alone}")
    print(f"serve concurrent: {len(prompts)} requests at once = one at a time")

elif mode == "stalled-reader":
    # A client that sends a long streamed request and never reads (run by serve_test.sh in a
    # network namespace with small TCP send buffers, against --http-timeout 2): once a write has
    # waited 2 s, the connection closes and the generation is cancelled, and the server serves
    # the next request. Without the write deadline it ran to its end, and the connection with its
    # unsent bytes stayed open for good.
    import socket, time, urllib.parse
    u = urllib.parse.urlparse(base)
    before = metric("kvmesh:request_cancelled_total")
    body = json.dumps({"prompt": "Count:", "max_tokens": 4000, "ignore_eos": True,
                       "stream": True, "logprobs": 20}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((u.hostname, u.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    t = time.time()
    while time.time() - t < 60 and metric("kvmesh:request_cancelled_total") == before:
        time.sleep(0.1)
    waited = time.time() - t
    check(metric("kvmesh:request_cancelled_total") == before + 1,
          f"a stalled reader was not cancelled within {waited:.0f} s")
    check(metric("kvmesh:num_requests_running") == 0, "still running after the cancel")
    code, text, _ = call("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(code == 200, f"after a stalled reader: {code} {text}")
    s.close()
    print(f"serve stalled reader: cancelled {waited:.1f} s after the request (--http-timeout 2)")
    # The same over the RPC (--rpc-frame-timeout 2), 8 generations on one connection that reads
    # nothing: Frame{1: id, 3: GenerateRequest{1: "Count:", 3: 4000, 6: true}}.
    import struct
    before = metric("kvmesh:request_cancelled_total")
    r = socket.socket()
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    r.connect((u.hostname, int(sys.argv[3])))
    g = b"\x0a\x06Count:" + b"\x18\xa0\x1f" + b"\x30\x01"
    for rid in range(1, 9):
        f = b"\x08" + bytes([rid]) + b"\x1a" + bytes([len(g)]) + g
        r.sendall(struct.pack("<I", len(f)) + f)
    t = time.time()
    while time.time() - t < 60 and metric("kvmesh:request_cancelled_total") < before + 8:
        time.sleep(0.1)
    waited = time.time() - t
    check(metric("kvmesh:request_cancelled_total") == before + 8,
          f"a stalled RPC reader's 8 generations: {metric('kvmesh:request_cancelled_total') - before}"
          f" cancelled within {waited:.0f} s")
    check(metric("kvmesh:num_requests_running") == 0, "still running after the RPC cancels")
    r.close()
    print(f"serve stalled reader: an RPC connection's 8 generations cancelled {waited:.1f} s after "
          f"they were sent (--rpc-frame-timeout 2)")
