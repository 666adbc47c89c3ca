"""The main job's client: a multi-turn conversation over a long document, then two independent
requests on the same document, through kvmesh's OpenAI-compatible HTTP API. Prints each answer,
its time to first token (measured here, from the streamed response) and the prompt tokens served
from the KV cache, and the server's prefix-cache counters from /metrics.

usage: demo_client.py BASE_URL
"""
import json
import sys
import time
import urllib.request

base = sys.argv[1]


def metrics():
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    vals = {}
    for line in text.splitlines():
        if line.startswith("kvmesh:prefix_cache_"):
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            vals[name] = value
    return vals


def ask(messages, session=None):
    body = {"messages": messages, "temperature": 0, "max_tokens": 48, "stream": True,
            "stream_options": {"include_usage": True}}
    if session:
        body["session_id"] = session
    req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, text, usage = None, "", {}
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                piece = c["delta"].get("content", "")
                if piece and ttft is None:
                    ttft = time.monotonic() - t0
                text += piece
    return text.strip(), (ttft or 0) * 1000, usage


doc = " ".join(f"Section {i}: the cluster stores block {i} of the shared context on tier {i % 3}."
               for i in range(1, 60))
print(f"== multi-turn conversation over a {len(doc)}-character document (session 'demo')")
messages = [{"role": "user", "content": f"Here is a document:\n{doc}\n\nWhich tier stores block 7?"}]
for turn, follow_up in enumerate(["And block 12?", "Which tier stores block 30?", None], 1):
    answer, ttft, usage = ask(messages, session="demo")
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    print(f"[turn {turn}] {usage.get('prompt_tokens')} prompt tokens, {cached} cached, "
          f"TTFT {ttft:.0f} ms\n{answer}")
    messages.append({"role": "assistant", "content": answer})
    if follow_up:
        messages.append({"role": "user", "content": follow_up})

print("== two independent requests on the same document")
for block in (21, 45):
    answer, ttft, usage = ask([{"role": "user", "content":
                                f"Here is a document:\n{doc}\n\nWhich tier stores block {block}?"}])
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    print(f"[request, block {block}] {usage.get('prompt_tokens')} prompt tokens, {cached} cached, "
          f"TTFT {ttft:.0f} ms\n{answer}")

m = metrics()
q, h = m.get("kvmesh:prefix_cache_queries_total", 0), m.get("kvmesh:prefix_cache_hits_total", 0)
print(f"== /metrics: prefix cache {h:.0f} of {q:.0f} prompt tokens hit ({100 * h / max(q, 1):.0f}%)")
