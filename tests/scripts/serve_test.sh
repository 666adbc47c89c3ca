#!/usr/bin/env bash
# `kvmesh serve` end to end on loopback: the OpenAI-compatible API (chat, streaming,
# completions, sessions with the prefix-cache hit counter rising, malformed input), the official
# `openai` Python client when installed, API keys, body limits, overload -> 429, and SIGTERM
# shutdown (exit 0 within 30 s) for one process and for tp = 2 under mpirun, where the ranks
# other than 0 rest while the server is idle.
# Usage: serve_test.sh KVMESH_BINARY
set -uo pipefail
bin="$1"
here="$(cd "$(dirname "$0")" && pwd)"
model="${KVMESH_MODEL:-${KVMESH_CACHE:-$HOME/.cache/kvmesh}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -f "$model" ]]; then echo "SKIP: model not pulled ($model)"; exit 77; fi
work="$(mktemp -d)"
pid=""
cleanup() { [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/log" ]] && tail -n 5 "$work/log" >&2; exit 1; }

# start NAME ARGS...: launches a server on a free port, sets $pid and $url.
start() {
  "$@" --model "$model" --port 0 --rpc-port 0 >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    port="$(grep -o 'http://127.0.0.1:[0-9]*' "$work/log" | head -n1 | sed 's/.*://')"
    [[ -n "$port" ]] && break
    kill -0 "$pid" 2>/dev/null || fail "server exited: $(cat "$work/log")"
    sleep 0.1
  done
  [[ -n "$port" ]] || fail "server did not start"
  url="http://127.0.0.1:$port"
  rpc="$(grep -o 'RPC (kvmesh.v1) on 127.0.0.1:[0-9]*' "$work/log" | head -n1 | sed 's/.*://')"
}

# rank0_of PATTERN: the pid of MPI rank 0 among the processes matching PATTERN.
rank0_of() {
  local p
  for p in $(pgrep -f "$1"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then
      echo "$p"
      return
    fi
  done
  fail "could not find rank 0 of '$1'"
}

# idle_ranks_rest PATTERN: the ranks other than 0 of an idle server use under a quarter of a
# core over 2 s (followers waiting in a blocking MPI call once kept a core busy each).
idle_ranks_rest() {
  local p a b tck used n=0
  tck="$(getconf CLK_TCK)"
  sleep 1
  for p in $(pgrep -f "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=[1-9]" || continue
    n=$((n + 1))
    a="$(awk '{print $14 + $15}' "/proc/$p/stat")"
    sleep 2
    b="$(awk '{print $14 + $15}' "/proc/$p/stat")"
    used=$(( (b - a) * 100 / (2 * tck) ))
    [[ $used -lt 25 ]] || fail "idle rank (pid $p of '$1') used ${used}% of a core over 2 s"
    echo "idle rank of '$1': ${used}% of a core over 2 s"
  done
  [[ $n -ge 1 ]] || fail "no rank other than 0 of '$1' found"
}

# stop [PID]: SIGTERM to PID (default: the server), then the server must exit 0 within 30 s.
stop() {
  kill -TERM "${1:-$pid}"
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then fail "still running 30 s after SIGTERM"; fi
  wait "$pid"; local rc=$?
  pid=""
  [[ "$rc" == 0 ]] || fail "exit code $rc after SIGTERM"
}

start "$bin" serve --threads 2
python3 "$here/serve_test.py" "$url" main || fail "main"
if python3 -c "import openai" 2>/dev/null; then
  python3 - "$url" <<'PY' || fail "openai client"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
r = c.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=16,
                              messages=[{"role": "user", "content": "What is the capital of France?"}])
assert "Paris" in r.choices[0].message.content, r
parts = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
    model="smollm2-135m-instruct", temperature=0, max_tokens=16, stream=True,
    messages=[{"role": "user", "content": "What is the capital of France?"}]) if ch.choices]
assert "".join(parts) == r.choices[0].message.content, parts
print("serve openai: the official client, plain and streamed, agrees")
PY
else
  echo "serve openai: SKIPPED (python package 'openai' not installed)"
fi
# The cluster RPC API through `kvmesh client`: health, tokenize, chat, a server-side session
# whose cached tokens climb, cluster status and cache stats; a malformed frame is refused with
# an Error and the server keeps serving.
rpcc() { "$bin" client "$1" --port "$rpc" "${@:2}"; }
[[ "$(rpcc health)" == '{"status":"ok"}' ]] || fail "rpc health"
[[ "$(rpcc tokenize --text "Hello world")" == '{"ids":[19556,905]}' ]] || fail "rpc tokenize"
rpcc chat --message "What is the capital of France?" --max-tokens 16 >"$work/rpc.chat" 2>/dev/null || fail "rpc chat"
grep -q Paris "$work/rpc.chat" || fail "rpc chat answer: $(cat "$work/rpc.chat")"
python3 -c "
doc = ' '.join(f'Item {i} is kept on shelf {i % 4}.' for i in range(1, 40))
print(doc + ' Where is item 9?'); print('And item 14?'); print('And item 33?')" >"$work/turns"
rpcc session --id rpc1 --turns "$work/turns" --max-tokens 16 >"$work/rpc.session" || fail "rpc session"
python3 - "$work/rpc.session" <<'PY' || fail "rpc session cached tokens: $(grep turn "$work/rpc.session")"
import re, sys
cached = [int(m) for m in re.findall(r"prompt tokens, (\d+) cached", open(sys.argv[1]).read())]
assert len(cached) == 3 and cached[1] > 300 and cached[2] > cached[1], cached
print("serve rpc: session cached tokens per turn", cached)
PY
# n choices over RPC (--n: three chat requests in flight at once on one connection): one of them
# computes the prompt (whichever reaches the scheduler first: the server tokenises requests in
# parallel) and the other two read its full blocks from the cache; the same seed gives the same
# three choices again.
python3 -c "print(' '.join(f'Crate {i} holds {i * 7} bolts.' for i in range(1, 30)) + ' Which crate holds 91 bolts?')" >"$work/rpc.doc"
for k in 1 2; do
  rpcc chat --message "$(cat "$work/rpc.doc")" --n 3 --temperature 0.8 --seed 7 --max-tokens 8 \
    >"$work/rpc.n$k" 2>"$work/rpc.n$k.err" || fail "rpc n = 3: $(cat "$work/rpc.n$k.err")"
done
python3 - "$work/rpc.n1" "$work/rpc.n1.err" "$work/rpc.n2" <<'PY' || fail "rpc n = 3: $(cat "$work/rpc.n1" "$work/rpc.n1.err")"
import re, sys
out, err = open(sys.argv[1]).read(), open(sys.argv[2]).read()
heads = [l.split("]")[0] + "]" for l in out.splitlines() if l.startswith("[choice")]
assert heads == ["[choice 0]", "[choice 1]", "[choice 2]"], heads
s = [(int(p), int(c)) for p, c in re.findall(r"choice \d: (\d+) prompt tokens \((\d+) cached\)", err)]
assert len(s) == 3, err
p = s[0][0]
cached = sorted(c for _, c in s)
assert cached[0] < p - 16 and cached[1] == cached[2] and p - 16 <= cached[1] < p, s
assert len(out) > 3 * len("[choice 0] \n"), "no choice has text"
assert out == open(sys.argv[3]).read(), "the same seed gave other choices"
print("serve rpc: n = 3 choices; cached tokens", [c for _, c in s], "of", p)
PY
# A request over the context: refused in the HTTP API's (vLLM's) words, naming the input.
rpcc generate --prompt "x" --max-tokens 9000 >/dev/null 2>"$work/rpc.ctx" && fail "rpc over the context succeeded"
grep -q "maximum context length is 8192 tokens. However, you requested 9001 tokens (1 in the prompt" "$work/rpc.ctx" ||
  fail "rpc context error: $(cat "$work/rpc.ctx")"
rpcc chat --message "x" --max-tokens 9000 >/dev/null 2>"$work/rpc.ctx" && fail "rpc chat over the context succeeded"
grep -q "maximum context length is 8192 tokens. However, you requested [0-9]* tokens ([0-9]* in the messages" "$work/rpc.ctx" ||
  fail "rpc chat context error: $(cat "$work/rpc.ctx")"
rpcc status | python3 -c "import json,sys; s=json.load(sys.stdin); assert s['world']==1 and s['ranks'][0]['kvBlocks']>0, s" || fail "rpc status"
rpcc stats | python3 -c "import json,sys; s=json.load(sys.stdin); assert int(s['prefixHitTokens'])>0, s" || fail "rpc stats"
# Sends a frame that announces $1 bytes and holds the hex bytes $2 (its start, or nothing) on the
# RPC port, reads until the server closes the connection, and checks that the reply holds $3 and
# came after $4 to $5 seconds.
rpc_partial_frame() {
  python3 - "$rpc" "$@" <<'PY'
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
t = time.time()
s.sendall(struct.pack("<I", int(sys.argv[2])) + bytes.fromhex(sys.argv[3]))
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
took = time.time() - t
assert sys.argv[4].encode() in data, data
assert float(sys.argv[5]) <= took <= float(sys.argv[6]), took
PY
}
# An announced frame over the limit: an Error frame ("exceeds the limit") at once, then close.
rpc_frame_refused() { rpc_partial_frame "$1" "" "exceeds the limit" 0 5; }
rpc_frame_refused $((0xFFFFFFF0)) || fail "rpc malformed frame"  # over the 4 MiB frame limit
echo "serve rpc: oversized frame refused with an Error frame, connection closed"
[[ "$(rpcc health)" == '{"status":"ok"}' ]] || fail "rpc serving after a bad frame"
# More sessions opened than the table holds (1024), never closed: the least recently used go,
# so another client can still open one (frames encoded by hand: Frame{1: id, 7: SessionOpen}).
python3 - "$rpc" "$here" <<'PY' || fail "rpc session table, max_tokens, tokenising off the io thread"
import socket, struct, sys
sys.path.insert(0, sys.argv[2])
from rpc_wire import reply_bytes as reply, varint
def frame(rid, sid):
    body = b"\x0a" + bytes([len(sid)]) + sid
    f = b"\x08" + bytes([rid & 0x7f]) + b"\x3a" + bytes([len(body)]) + body
    return struct.pack("<I", len(f)) + f
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for i in range(1100):
    s.sendall(frame(i, b"junk%d" % i))
    r = reply(s)
    assert b"\x9a\x01" not in r[:4] and b"too many" not in r, (i, r)
s.close()
t = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
t.sendall(frame(1, b"legit"))
r = reply(t)
assert b"legit" in r and b"too many" not in r, r
print("serve rpc: 1100 sessions opened and never closed; the oldest evicted, a new client still opens one")
# A negative max_tokens is refused naming the field (it ran 256 tokens): Frame{1: 1,
# 3: GenerateRequest{1: "x", 3: -1}}.
g = b"\x0a\x01x" + b"\x18" + b"\xff" * 9 + b"\x01"
f = b"\x08\x01\x1a" + bytes([len(g)]) + g
t.sendall(struct.pack("<I", len(f)) + f)
r = reply(t)
assert b"max_tokens must be >= 0" in r, r
print("serve rpc: a negative max_tokens is refused naming the field")
# A 3.9 MB tokenize frame is tokenised off the io thread: health keeps answering on another
# connection meanwhile (Frame{1: 7, 11: TokenizeRequest{1: text}}, Frame{1: id, 17: {}}).
import threading, time
text = (b"the quick brown fox jumps over the lazy dog " * 90000)[:3900000]
body = b"\x0a" + varint(len(text)) + text
f = b"\x08\x07\x5a" + varint(len(body)) + body
big = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
probe = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
done = []
def tokenize():
    t = time.time()
    big.sendall(struct.pack("<I", len(f)) + f)
    reply(big)
    done.append(time.time() - t)
th = threading.Thread(target=tokenize)
th.start()
waits = []
while not done:
    t = time.time()
    h = b"\x08\x02\x8a\x01\x00"
    probe.sendall(struct.pack("<I", len(h)) + h)
    assert b"ok" in reply(probe)
    waits.append(time.time() - t)
    time.sleep(0.02)
th.join()
if done[0] < 0.3:
    print(f"serve rpc: SKIPPED the health-while-tokenising check: 3.9 MB took only {done[0]:.2f} s")
else:
    assert max(waits) < done[0] / 2, (max(waits), done[0])
    print(f"serve rpc: health answered in at most {max(waits) * 1000:.0f} ms while a 3.9 MB "
          f"tokenize frame took {done[0]:.2f} s")
PY
# Requests while their prompts are tokenised (frames encoded by hand, as above): a cancel ends a
# request before it reaches the engine (it was submitted, then refused as over the context); a
# session closed meanwhile is not kept by the engine when its turn ends (it was, KV and all);
# tokenize requests count against the connection's 64 requests in flight (they were unbounded).
python3 - "$rpc" "$here" <<'PY' || fail "rpc requests while their prompts are tokenised"
import socket, sys
sys.path.insert(0, sys.argv[2])
from rpc_wire import frame, ld, reply, vi
def until(s, rid, body):
    while True:
        got = reply(s)
        if got[0] == rid and got[1] in (body, 19):
            return got
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=120)
long = (b"the quick brown fox jumps over the lazy dog " * 50000)[:2000000]
s.sendall(frame(5, 3, ld(1, long)) + frame(5, 6, b""))
rid, body, f = until(s, 5, 5)
assert body == 5 and f[1] == [b"cancelled"] and f.get(4, [0]) == [0], (body, f)
print("serve rpc: a request cancelled while its 2 MB prompt was tokenised ends 'cancelled'")
def sessions():
    s.sendall(frame(9, 3, ld(1, b"x") + vi(3, 1)) )  # a step, so the stats are the latest
    until(s, 9, 5)
    s.sendall(frame(10, 15, b""))
    return until(s, 10, 16)[2].get(10, [0])[0]
before = sessions()
s.sendall(frame(1, 7, ld(1, b"closing")) +
          frame(2, 8, ld(1, b"closing") + ld(2, b"Say hi.") + vi(3, 4)) +
          frame(3, 9, ld(1, b"closing")))
rid, body, f = until(s, 2, 5)
assert body == 5, f
after = sessions()
assert after == before, f"the engine keeps {after} sessions, {before} before the closed one's turn"
print(f"serve rpc: a session closed while its turn was tokenised is not kept ({after} sessions)")
text = (b"a b c d e f g h " * 20000)[:200000]
s.sendall(b"".join(frame(100 + k, 11, ld(1, text)) for k in range(80)))
codes = []
for _ in range(80):
    rid, body, f = reply(s)
    codes.append(f.get(1, [0])[0] if body == 19 else 0)
refused = sum(c == 8 for c in codes)
assert refused >= 1 and refused + codes.count(0) == 80, codes
print(f"serve rpc: 80 pipelined tokenize requests: {80 - refused} answered, {refused} refused "
      "as over the 64 in flight")
# A body from a newer protocol (an unknown field, 40) and a reply body (Token, 4) sent by a
# client are answered with an error (12 unimplemented, 3 invalid argument); the connection
# keeps serving (they closed it, cancelling its generations).
s.sendall(frame(200, 40, b"") + frame(201, 4, b"") + frame(202, 17, b""))
got = [reply(s) for _ in range(3)]
assert [(r, b) for r, b, _ in got] == [(200, 19), (201, 19), (202, 18)], got
assert got[0][2][1] == [12] and got[1][2][1] == [3], got
print("serve rpc: an unknown body and a reply body get errors 12 and 3; the connection serves on")
PY

# A real Prometheus (Debian's) scrapes /metrics: the target is up and kvmesh's series are stored.
if command -v prometheus >/dev/null; then
  pport="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  cat >"$work/prometheus.yml" <<PROM
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: kvmesh
    static_configs: [{targets: ["127.0.0.1:${url##*:}"]}]
PROM
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
  prom=$!
  python3 - "http://127.0.0.1:$pport" <<'PY' || { kill "$prom"; fail "prometheus scrape: $(tail -n 3 "$work/prometheus.log")"; }
import json, sys, time, urllib.request
base = sys.argv[1]
for _ in range(300):
    try:
        q = "/api/v1/query?query=" + urllib.request.quote('kvmesh:prefix_cache_hits_total')
        r = json.loads(urllib.request.urlopen(base + q, timeout=5).read())
        if r["data"]["result"]:
            hits = float(r["data"]["result"][0]["value"][1])
            t = json.loads(urllib.request.urlopen(base + "/api/v1/targets", timeout=5).read())
            assert t["data"]["activeTargets"][0]["health"] == "up", t
            print(f"serve prometheus: target up, kvmesh:prefix_cache_hits_total = {hits:.0f}")
            sys.exit(0)
    except (OSError, KeyError, IndexError):
        pass
    time.sleep(0.1)
sys.exit("no kvmesh series in Prometheus after 30 s")
PY
  kill "$prom"
  wait "$prom" 2>/dev/null
else
  echo "serve prometheus: SKIPPED (prometheus not installed)"
fi
# A request in flight when SIGTERM arrives still completes. SIGTERM is sent once the server
# reports it running (a fixed sleep raced the client's start on a loaded machine). 160 tokens:
# well inside the 25 s drain even with the other tests on both cores (400 once ran past it
# there, and the drain then cancels what is left, as it should).
python3 - "$url" >"$work/inflight" 2>&1 <<'PY' &
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/completions", method="POST", data=json.dumps(
    {"prompt": "Count:", "max_tokens": 160, "ignore_eos": True, "temperature": 0}).encode())
print(json.loads(urllib.request.urlopen(req, timeout=60).read())["usage"]["completion_tokens"])
PY
client=$!
python3 - "$url" <<'PY' || fail "the in-flight request never showed as running"
import re, sys, time, urllib.request
for _ in range(1000):
    text = urllib.request.urlopen(sys.argv[1] + "/metrics", timeout=5).read().decode()
    if re.search(r"^kvmesh:num_requests_running(\{[^}]*\})? 1$", text, re.M):
        sys.exit(0)
    time.sleep(0.01)
sys.exit(1)
PY
stop
wait "$client"
[[ "$(cat "$work/inflight")" == 160 ]] || fail "in-flight request across SIGTERM: $(cat "$work/inflight")"
echo "serve shutdown: SIGTERM drained the in-flight request and exited 0"

start "$bin" serve --threads 1 --api-key s3cret --max-body-bytes 4096 --rpc-frame-timeout 2 \
  --kv-cache-mem 4
python3 "$here/serve_test.py" "$url" auth s3cret || fail "auth"
"$bin" client health --port "$rpc" >/dev/null 2>"$work/err" && fail "rpc without a key succeeded"
grep -q "the first frame must be Auth" "$work/err" || fail "rpc without a key: $(cat "$work/err")"
"$bin" client health --port "$rpc" --api-key wrong >/dev/null 2>&1 && fail "rpc with a wrong key succeeded"
[[ "$("$bin" client health --port "$rpc" --api-key s3cret)" == '{"status":"ok"}' ]] || fail "rpc with the key"
# No --max-tokens: the server's default, what the context and this 4 MiB KV pool leave (at most
# 175 tokens after a 2-token prompt), not a refusal.
"$bin" client generate --port "$rpc" --api-key s3cret --prompt "Count:" --temperature 0 \
  >/dev/null 2>"$work/err" || fail "rpc generate without --max-tokens: $(cat "$work/err")"
gen="$(grep -o '[0-9]* generated' "$work/err" | cut -d' ' -f1)"
[[ -n "$gen" && "$gen" -ge 1 && "$gen" -le 175 ]] || fail "rpc default max_tokens: $(cat "$work/err")"
echo "serve rpc: no --max-tokens -> $gen tokens (what the pool leaves)"
# 1 MiB announced by a client that has not authenticated.
rpc_frame_refused $((1 << 20)) || fail "rpc frame limit before auth"
# A connection that never authenticates is closed after the frame timeout (2 s), with an Error.
python3 - "$rpc" <<'PY' || fail "rpc idle connection before auth"
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
t, data = time.time(), b""
while chunk := s.recv(4096):
    data += chunk
assert b"no Auth frame within 2 s" in data and 1.5 <= time.time() - t <= 10, (data, time.time() - t)
PY
echo "serve rpc auth: a connection that sends no Auth frame is closed after 2 s"
# A frame begun and never finished (--rpc-frame-timeout 2): an Error frame, then the connection
# closes, 2 s after the last progress; before, a stalled client held its buffer forever.
rpc_partial_frame 100 0801 "a frame was not completed within 2 s" 1.5 10 || fail "rpc frame deadline"
echo "serve rpc: a frame stalled for 2 s fails its connection"
echo "serve rpc auth: the first frame must carry the key; frames before it are small"
python3 "$here/serve_test.py" "$url" limits s3cret || fail "limits"
stop

# A client that stops reading its stream, over HTTP (--http-timeout 2) and over the RPC
# (--rpc-frame-timeout 2): the connection closes and its generations are cancelled once a write
# has waited 2 s. In a network namespace of the test's own whose TCP send buffers hold 4 KiB
# (loopback's default, up to 4 MiB, takes minutes of tokens to fill).
if [[ "$(id -u)" != 0 ]] || ! unshare -n true 2>/dev/null || ! command -v ip >/dev/null; then
  echo "serve stalled reader: SKIPPED: a network namespace needs root, unshare and ip (iproute2)"
else
  unshare -n bash -c '
    set -u
    ip link set lo up || exit 1
    # A read-only /proc/sys (a container): the check cannot run there.
    { echo "4096 4096 4096" >/proc/sys/net/ipv4/tcp_wmem; } 2>/dev/null || exit 77
    "$1" serve --model "$2" --port 0 --rpc-port 0 --threads 1 --http-timeout 2 \
      --rpc-frame-timeout 2 >"$3/stalled.log" 2>&1 &
    spid=$! port="" rpc=""
    for _ in $(seq 1 300); do
      port="$(grep -o "http://127.0.0.1:[0-9]*" "$3/stalled.log" | head -n1 | sed "s/.*://")"
      rpc="$(grep -o "RPC (kvmesh.v1) on 127.0.0.1:[0-9]*" "$3/stalled.log" | head -n1 | sed "s/.*://")"
      [[ -n "$port" && -n "$rpc" ]] && break
      sleep 0.1
    done
    [[ -n "$port" && -n "$rpc" ]] || { kill -9 $spid; cat "$3/stalled.log"; exit 1; }
    python3 "$4/serve_test.py" "http://127.0.0.1:$port" stalled-reader "$rpc"
    rc=$?
    kill -TERM $spid
    wait $spid || rc=1
    exit $rc
  ' _ "$bin" "$model" "$work" "$here"
  rc=$?
  if [[ $rc == 77 ]]; then
    echo "serve stalled reader: SKIPPED: /proc/sys is read-only here (no TCP buffer sizes to set)"
  elif [[ $rc != 0 ]]; then
    tail -n 5 "$work/stalled.log" >&2
    fail "a client that stops reading"
  fi
fi

# The overload settings from a YAML --config (vLLM's names); the command line's --port 0 wins
# over the file's port.
printf 'max_num_seqs: 1\nmax_waiting: 1\nenable_prefix_caching: false\nport: 1\nthreads: 1\n' >"$work/config.yaml"
start "$bin" serve --config "$work/config.yaml"
python3 "$here/serve_test.py" "$url" overload || fail "overload"
python3 "$here/serve_test.py" "$url" reuse off || fail "enable_prefix_caching: false"
stop
# n choices against a small queue: capped by it, and a refused choice ends its siblings.
start "$bin" serve --threads 1 --max-seqs 1 --max-waiting 2
python3 "$here/serve_test.py" "$url" choices || fail "choices"
stop
# --prefix-reuse turns reuse back on over the file's enable_prefix_caching: false.
start "$bin" serve --config "$work/config.yaml" --prefix-reuse
python3 "$here/serve_test.py" "$url" reuse on || fail "--prefix-reuse over the config"
stop

if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe --bind-to none)
  [[ "$(id -u)" == 0 ]] && mpi+=(--allow-run-as-root)
  start "${mpi[@]}" -np 2 "$bin" serve --tp 2 --threads 1
  python3 "$here/serve_test.py" "$url" main || fail "tp=2 main"
  "$bin" client status --port "$rpc" | python3 -c "
import json, sys
s = json.load(sys.stdin)
assert s['world'] == 2 and s['tp'] == 2 and [r['role'] for r in s['ranks']] == ['coordinator+worker', 'worker'], s
print('serve rpc tp=2 status:', [r['shard'] for r in s['ranks']])" || fail "tp=2 cluster status"
  # Under mpirun the coordinator (rank 0) takes SIGTERM (as every rank does under Slurm's
  # scancel; workers ignore it and stop when rank 0 has drained); mpirun then exits 0.
  idle_ranks_rest "kvmesh serve --tp 2"
  r0="$(rank0_of "kvmesh serve --tp 2")" || exit 1
  stop "$r0"
  echo "serve tp=2: same API under mpirun, clean SIGTERM"
  # Two data-parallel replicas behind one coordinator.
  start "${mpi[@]}" -np 2 "$bin" serve --dp 2 --threads 1
  rpcc status | python3 -c "
import json, sys
s = json.load(sys.stdin)
assert s['dp'] == 2 and [r['role'] for r in s['ranks']] == ['coordinator+worker', 'replica-leader+worker'], s" ||
    fail "dp=2 cluster status"
  SERVE_TEST_DP=2 python3 "$here/serve_test.py" "$url" main || fail "dp=2 main"
  idle_ranks_rest "kvmesh serve --dp 2"
  r0="$(rank0_of "kvmesh serve --dp 2")" || exit 1
  stop "$r0"
  echo "serve dp=2: two replicas behind one API, clean SIGTERM"
  # Two pipeline stages: concurrent requests run as overlapping steps; SIGTERM drains them.
  start "${mpi[@]}" -np 2 "$bin" serve --pp 2 --threads 1
  python3 "$here/serve_test.py" "$url" main || fail "pp=2 main"
  python3 "$here/serve_test.py" "$url" concurrent || fail "pp=2 concurrent"
  r0="$(rank0_of "kvmesh serve --pp 2")" || exit 1
  stop "$r0"
  echo "serve pp=2: pipelined steps behind the same API, clean SIGTERM"
fi
echo "serve: all cases passed"
