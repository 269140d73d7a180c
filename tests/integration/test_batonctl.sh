#!/usr/bin/env bash
# batonctl and the Python client, in three parts:
#   1. usage errors and exit codes, with nothing running;
#   2. batonctl and the Python client against
#      tests/integration/fake_baton_server.py, a ROUTER that answers the client
#      protocol with canned behaviour and logs what it received (so the
#      fields on the wire are checked). It runs under /usr/bin/python3, which
#      sees Debian's python3-zmq and python3-protobuf; the part is skipped,
#      with the reason printed, when those or build/gen/python/baton_pb2.py
#      are missing;
#   3. batonctl against a real batond on tests/integration/configs/batonctl.yaml.
#
# Prints its own summary line, "batonctl: N passed, N failed, N skipped",
# and writes "PASS FAIL SKIP" to $BATON_TEST_COUNTS_OUT when set (as
# tests/integration/run.sh does, which adds them to its counts).  The
# folders of parts 2 and 3 (the fake server's request log, batond.log) go
# under $BATON_TEST_LOGDIR when set, else /tmp/baton-test-ctl-*; a part
# with a failure keeps its folder and shows the tail of its log.
set -u
BUILD=${BUILD:-build}
CTL=$BUILD/batonctl
PY=/usr/bin/python3
pass=0; fail=0; skip=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# A folder for part NAME, under $BATON_TEST_LOGDIR when set.
test_dir() {
  if [ -n "${BATON_TEST_LOGDIR:-}" ]; then mktemp -d "$BATON_TEST_LOGDIR/$1-XXXXXX"
  else mktemp -d "/tmp/baton-test-$1-XXXXXX"; fi
}
# Removes folder DIR when no check failed since FAILS_BEFORE, else keeps it
# and shows the end of LOG.
keep_on_failure() {
  local dir=$1 fails_before=$2 log=$3
  if [ "$fail" -eq "$fails_before" ]; then rm -rf "$dir"; return; fi
  echo "evidence kept: $dir"
  echo "--- last 60 lines of $log"
  tail -60 "$log" 2>/dev/null | sed 's/^/    /'
}

# expect_rc WANT DESCRIPTION CMD...: runs CMD, keeps its output in $out.
expect_rc() {
  local want=$1 what=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" -eq "$want" ]; then ok; else bad "batonctl: $what: exit $rc, expected $want"; echo "$out"; fi
}
# expect_out TEXT DESCRIPTION: the last command's output contains TEXT.
expect_out() {
  if grep -qF -- "$1" <<<"$out"; then ok; else bad "batonctl: $2: no '$1' in output"; echo "$out"; fi
}

# ---- usage and connection errors (no daemon needed) ----------------------
nosock=ipc:///tmp/baton-ctl-test-none-$$.sock
expect_rc 0 "--help" "$CTL" --help;                  expect_out "usage: batonctl" "--help"
expect_out "generate GRAPH TEXT" "--help lists generate"
expect_out "transcribe FILE" "--help lists transcribe"
expect_rc 2 "no arguments" "$CTL"
expect_rc 0 "--version" "$CTL" --version;            expect_out "batonctl 0." "--version"
expect_rc 2 "unknown command" "$CTL" frobnicate;     expect_out "unknown command 'frobnicate'" "unknown command"
expect_rc 2 "unknown option" "$CTL" --frob health
expect_rc 2 "infer without graph" "$CTL" infer
expect_rc 2 "generate without text" "$CTL" generate chat
expect_rc 2 "bad dtype" "$CTL" --endpoint "$nosock" infer g --input x=q8:1
expect_rc 2 "dims mismatch" "$CTL" --endpoint "$nosock" infer g --input x=i32:2,3:1,2,3
expect_rc 2 "bad value" "$CTL" --endpoint "$nosock" infer g --input x=i32:1,zz
expect_rc 2 "max-iters 0" "$CTL" --endpoint "$nosock" infer g --max-iters loop=0
expect_rc 2 "top-p > 1" "$CTL" --endpoint "$nosock" infer g --top-p 2
expect_rc 2 "request option on health" "$CTL" health --stream
expect_rc 2 "--timeout-ms not a number" "$CTL" --timeout-ms soon health
expect_rc 2 "cancel without id" "$CTL" cancel
expect_rc 2 "--max-tokens 0" "$CTL" --endpoint "$nosock" generate chat hi --max-tokens 0
expect_rc 2 "--stop empty" "$CTL" --endpoint "$nosock" generate chat hi --stop ""
expect_out "a stop string cannot be empty" "--stop empty"
expect_rc 2 "--raw with infer" "$CTL" --endpoint "$nosock" infer g --raw
expect_rc 3 "no daemon" "$CTL" --endpoint "$nosock" health; expect_out "cannot connect" "no daemon"
expect_rc 3 "no daemon (env)" env BATON_ENDPOINT="$nosock" "$CTL" stats
expect_rc 3 "no tcp daemon" "$CTL" --endpoint tcp://127.0.0.1:1 --timeout-ms 300 health
# keygen: the two files with their modes, the public key printed (never
# the secret one), no overwrite; key options checked before connecting.
kdir=$(mktemp -d)
expect_rc 0 "keygen" "$CTL" keygen --out "$kdir" alice
if [ "$(stat -c %a "$kdir/alice.key")" = 600 ] && [ "$(stat -c %a "$kdir/alice.pub")" = 644 ] &&
   [ "$out" = "$(cat "$kdir/alice.pub")" ] && ! grep -qF -- "$(cat "$kdir/alice.key")" <<<"$out"
then ok; else bad "keygen: modes $(stat -c %a "$kdir/alice.key" "$kdir/alice.pub"), output '$out'"; fi
expect_rc 1 "keygen over an existing pair" "$CTL" keygen --out "$kdir" alice
expect_out "never overwritten" "keygen over an existing pair"
expect_rc 2 "keygen without a name" "$CTL" keygen
expect_rc 2 "--out without keygen" "$CTL" --out "$kdir" health
expect_rc 2 "--server-key neither key nor file" "$CTL" --endpoint tcp://127.0.0.1:1 --server-key nope health
expect_rc 2 "--server-key a .key file" "$CTL" --endpoint tcp://127.0.0.1:1 --server-key "$kdir/alice.key" health
expect_rc 2 "--client-key without --server-key" "$CTL" --endpoint tcp://127.0.0.1:1 --client-key "$kdir/alice.key" health
chmod 640 "$kdir/alice.key"
expect_rc 2 "--client-key readable by the group" "$CTL" --endpoint tcp://127.0.0.1:1 \
  --server-key "$kdir/alice.pub" --client-key "$kdir/alice.key" health
expect_out "readable by group or others" "--client-key readable by the group"
rm -rf "$kdir"

# The Python example without a daemon: a clear message, exit 3, no traceback.
expect_rc 3 "example.py without a daemon" env BATON_PROTO_PATH="$BUILD/gen/python" \
  /usr/bin/python3 client/python/example.py --endpoint "$nosock"
expect_out "no answer from batond at $nosock" "example.py without a daemon"
if grep -q Traceback <<<"$out"; then bad "example.py without a daemon printed a traceback"; else ok; fi

# ---- end to end against the fake server ---------------------------------
export BATON_PROTO_PATH=$BUILD/gen/python
if [ ! -f "$BATON_PROTO_PATH/baton_pb2.py" ]; then
  echo "SKIP: batonctl end-to-end checks: $BATON_PROTO_PATH/baton_pb2.py not built (make all)"
  skip=$((skip + 1))
elif ! "$PY" -c 'import zmq, google.protobuf' 2>/dev/null; then
  echo "SKIP: batonctl end-to-end checks: $PY lacks zmq or protobuf (apt-get install python3-zmq python3-protobuf)"
  skip=$((skip + 1))
else
  tmp=$(test_dir ctl-fake)
  fails_before=$fail
  ep=ipc://$tmp/baton.sock
  "$PY" tests/integration/fake_baton_server.py "$ep" "$tmp/requests.log" &
  fake=$!
  for _ in $(seq 100); do [ -S "$tmp/baton.sock" ] && break; sleep 0.05; done
  E=(--endpoint "$ep")

  expect_rc 0 "health" "$CTL" "${E[@]}" health;      expect_out "ready: yes" "health"
  expect_rc 0 "stats" "$CTL" "${E[@]}" stats;        expect_out "baton_requests_total 1" "stats"
  expect_rc 0 "inspect" "$CTL" "${E[@]}" inspect chat; expect_out "graph chat:" "inspect"

  expect_rc 0 "infer" "$CTL" "${E[@]}" infer g --input x=i32:2,3:1,2,3,4,5,6 \
    --input prompt=text:"hello world" --input s=f32::1.5
  expect_out "x: i32[2,3] = [[1, 2, 3], [4, 5, 6]]" "infer prints small tensors"
  expect_out "prompt (text): hello world" "infer prints text"
  expect_out "s: f32[] = 1.5" "infer prints scalars"

  # A large tensor from a file: shape and the first values only.
  "$PY" -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<1000f", *range(1000)))' >"$tmp/x.bin"
  expect_rc 0 "infer @file" "$CTL" "${E[@]}" infer g --input x=f32:10,100:@"$tmp/x.bin"
  expect_out "x: f32[10,100] (1000 values), first: 0 1 2 3 4 5 6 7 ..." "large tensor preview"

  expect_rc 0 "infer --json" "$CTL" "${E[@]}" --json infer g --stream --input x=i32:2,2:1,2,3,-4 \
    --input prompt=text:"hé there" --max-iters decode_loop=4 --max-iters outer=2 \
    --temperature 0.5 --top-k 3 --top-p 0.9 --seed 7 --request-id json-1
  printf '%s\n' "$out" >"$tmp/json.out"
  json_check=$("$PY" - "$tmp/json.out" "$tmp/requests.log" 2>&1 <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
assert [l["type"] for l in lines] == ["chunk", "chunk", "response"], lines
assert "".join(l["value"]["text"] for l in lines[:2]) == "hé there", lines
assert [l["seq"] for l in lines[:2]] == [0, 1]
r = lines[2]
assert r["request_id"] == "json-1" and r["status"] == "OK" and r["code"] == 0, r
x = r["outputs"][0]
assert (x["name"], x["dtype"], x["dims"], x["values"]) == ("x", "i32", [2, 2], [1, 2, 3, -4]), x
req = [json.loads(l) for l in open(sys.argv[2])][-1]["infer"]
assert req["requestId"] == "json-1" and req["stream"], req
assert req["maxIters"] == {"decode_loop": 4, "outer": 2}, req
s = req["sampling"]
assert s["topK"] == 3 and s["seed"] == "7" and abs(s["temperature"] - 0.5) < 1e-6, s
assert [i["name"] for i in req["inputs"]] == ["x", "prompt"], req
assert req["inputs"][0]["dims"] == ["2", "2"] and req["inputs"][0]["dtype"] == "I32", req
EOF
)
  if [ -z "$json_check" ]; then ok; else bad "batonctl --json output or request fields: $json_check"; fi

  expect_rc 0 "generate" "$CTL" "${E[@]}" generate chat "The quick brown fox"
  expect_out "The quick brown fox" "generate streams the text"
  expect_out "OK: " "generate prints a summary"
  gen_in=$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["infer"]["inputs"][0]["name"])' "$tmp/requests.log")
  [ "$gen_in" = prompt ] && ok || bad "generate: the text went to input '$gen_in', expected the graph's first input 'prompt'"

  # --system: the prompt and the system turn go as messages to that input.
  expect_rc 0 "generate --system" "$CTL" "${E[@]}" generate conversation "Name a colour." \
    --system "Be brief." --input-name prompt
  conv=$("$PY" -c 'import json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print(q.get("inputs"), [(m["role"], m["content"]) for m in q["messages"]], q["messagesInput"])' "$tmp/requests.log")
  [ "$conv" = "None [('system', 'Be brief.'), ('user', 'Name a colour.')] prompt" ] && ok ||
    bad "generate --system: the request had $conv"
  expect_rc 2 "--system with infer" "$CTL" "${E[@]}" infer g --system x
  expect_out "--system is for generate and transcribe" "--system is for generate"
  expect_rc 2 "--raw with infer" "$CTL" "${E[@]}" infer g --raw
  expect_out "--input-name and --raw are for generate" "--raw is for generate"

  expect_rc 1 "status not OK" "$CTL" "${E[@]}" infer missing; expect_out "NOT_FOUND: unknown graph 'missing'" "status not OK"
  expect_rc 1 "deadline" "$CTL" "${E[@]}" --timeout-ms 300 infer slow; expect_out "DEADLINE_EXCEEDED" "deadline"
  expect_rc 3 "malformed answer" "$CTL" "${E[@]}" --timeout-ms 1000 infer garbage
  expect_out "malformed message" "malformed answer"
  # A cancel of an id nothing has in flight: said, and exit 1.
  expect_rc 1 "cancel unknown" "$CTL" "${E[@]}" cancel some-id
  expect_out "NOT_FOUND: no request 'some-id' is in flight" "cancel unknown"
  # transcribe: the file's bytes as 'audio', the options as JSON text, to
  # graph transcribe (or --graph), streamed.
  printf 'RIFF fake audio' >"$tmp/clip.wav"
  expect_rc 0 "transcribe" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --language en \
    --task translate
  tr_req=$("$PY" -c 'import base64,json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; i={t["name"]: base64.b64decode(t.get("data", "")).decode() for t in q["inputs"]}; print(q["graph"], q["stream"], i["audio"], i["options"], [t["dtype"] for t in q["inputs"]])' "$tmp/requests.log")
  [ "$tr_req" = "transcribe True RIFF fake audio {\"language\": \"en\", \"task\": \"translate\"} ['U8', 'U8']" ] &&
    ok || bad "transcribe: the request had $tr_req"
  expect_rc 0 "transcribe --graph" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --graph voice
  tr_req=$("$PY" -c 'import base64,json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print(q["graph"], [base64.b64decode(t.get("data", "")).decode() for t in q["inputs"]][1])' "$tmp/requests.log")
  [ "$tr_req" = "voice {}" ] && ok || bad "transcribe --graph: the request had $tr_req"
  # --system: a system turn as messages to input 'context' (a voice chat's
  # turns before the question).
  expect_rc 0 "transcribe --system" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --graph voice \
    --system "Be brief."
  tr_req=$("$PY" -c 'import json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print([t["name"] for t in q["inputs"]], [(m["role"], m["content"]) for m in q["messages"]], q["messagesInput"])' "$tmp/requests.log")
  [ "$tr_req" = "['audio', 'options'] [('system', 'Be brief.')] context" ] && ok ||
    bad "transcribe --system: the request had $tr_req"
  # --no-timestamps goes in the options; --segments prints the segments'
  # JSON lines as timed lines instead of the text, which otherwise prints
  # alone.
  expect_rc 0 "transcribe --no-timestamps" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" \
    --no-timestamps
  tr_req=$("$PY" -c 'import base64,json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print([base64.b64decode(t.get("data", "")).decode() for t in q["inputs"]][1])' "$tmp/requests.log")
  [ "$tr_req" = '{"timestamps": false}' ] && ok || bad "transcribe --no-timestamps: options $tr_req"
  # --prompt: previous text in the options, escaped as JSON; text that is
  # not UTF-8 is refused before anything is sent.
  expect_rc 0 "transcribe --prompt" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" \
    --prompt 'Hello "JFK" café'
  tr_req=$("$PY" -c 'import base64,json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print(json.loads([base64.b64decode(t.get("data", "")).decode() for t in q["inputs"]][1]))' "$tmp/requests.log")
  [ "$tr_req" = "{'prompt': 'Hello \"JFK\" café'}" ] && ok || bad "transcribe --prompt: options $tr_req"
  expect_rc 2 "transcribe --prompt, not UTF-8" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" \
    --prompt "$(printf 'caf\xe9')"
  expect_out "not valid UTF-8" "transcribe --prompt, not UTF-8"
  seg='{"id":0,"start":61.5,"end":67.25,"text":"Hello"}'
  expect_rc 0 "transcribe --segments" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --graph named \
    --segments --input "segments=text:$seg" --input text=text:Hello
  expect_out "[01:01.500 --> 01:07.250] Hello" "transcribe --segments"
  [ "$(grep -c Hello <<<"$out")" = 1 ] && ok || bad "transcribe --segments printed the text too: $out"
  expect_rc 0 "transcribe, segments not asked for" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" \
    --graph named --input "segments=text:$seg" --input text=text:Hello
  [ "$(grep -c Hello <<<"$out")" = 1 ] && ! grep -q '"start"' <<<"$out" && ok ||
    bad "transcribe without --segments printed them: $out"
  expect_rc 2 "--segments with --no-timestamps" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" \
    --segments --no-timestamps
  expect_out "does not go with --no-timestamps" "--segments with --no-timestamps"
  # Two text streams (a voice chat's): each from a line of its own after
  # its name; a stream called text keeps no label.
  expect_rc 0 "two text streams" "$CTL" "${E[@]}" infer named --stream \
    --input transcript=text:'what is it' --input answer=text:'a test' --input text=text:'plain'
  [ "$(printf '%s\n' "$out" | head -3)" = "$(printf 'transcript: what is it\nanswer: a test\nplain')" ] &&
    ok || bad "two text streams: printed $out"
  expect_rc 2 "transcribe --task" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --task sing
  expect_out "--task: 'sing' is transcribe or translate" "transcribe --task"
  expect_rc 2 "transcribe --language" "$CTL" "${E[@]}" transcribe "$tmp/clip.wav" --language 'e"n'
  expect_out "is not a language code" "transcribe --language"
  expect_rc 2 "transcribe without a file" "$CTL" "${E[@]}" transcribe
  expect_rc 2 "--language with infer" "$CTL" "${E[@]}" infer g --language en
  expect_out "--language, --task, --graph, --prompt, --segments and --no-timestamps are for transcribe" \
    "--language is for transcribe"
  # Stop strings, max_tokens, the text output and raw text go on the wire.
  expect_rc 0 "generate --stop" "$CTL" "${E[@]}" generate chat "a b" --stop "User:" \
    --stop END --max-tokens 7 --text-output text --raw --request-id stop-1
  limits=$("$PY" -c 'import json,sys; q=json.loads(open(sys.argv[1]).readlines()[-1])["infer"]; print(q["stop"], q["maxTokens"], q["textOutput"], q["rawInputs"])' "$tmp/requests.log")
  [ "$limits" = "['User:', 'END'] 7 text ['prompt']" ] && ok ||
    bad "generate --stop/--max-tokens/--text-output/--raw: the request had $limits"

  # Ctrl-C during infer cancels the request and waits for its CANCELLED.
  seen=$(grep -c '"graph": *"slow"' "$tmp/requests.log" 2>/dev/null)
  "$CTL" "${E[@]}" --timeout-ms 30000 infer slow >"$tmp/int.out" 2>&1 &
  ctl=$!
  # Signal only once the fake server has this request (SIGINT is ignored in
  # a background job until batonctl's handler is installed, before sending).
  for _ in $(seq 1 100); do
    [ "$(grep -c '"graph": *"slow"' "$tmp/requests.log" 2>/dev/null)" -gt "$seen" ] && break
    sleep 0.05
  done
  kill -INT "$ctl"
  wait "$ctl"; rc=$?
  if [ $rc -eq 1 ] && grep -q "CANCELLED" "$tmp/int.out"; then ok
  else bad "batonctl: Ctrl-C: exit $rc"; cat "$tmp/int.out"; fi

  out=$("$PY" tests/integration/test_python_client.py "$ep" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then ok; else bad "python client (exit $rc)"; echo "$out"; fi
  out=$("$PY" client/python/example.py --endpoint "$ep" chat "hello big world" 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q "hello big world" <<<"$out"; then ok; else bad "example.py (exit $rc)"; echo "$out"; fi

  kill "$fake" 2>/dev/null; wait "$fake" 2>/dev/null
  keep_on_failure "$tmp" "$fails_before" "$tmp/requests.log"
fi

# ---- against the real daemon ------------------------------------------------
if [ -x "$BUILD/batond" ] && [ -x "$BUILD/baton-worker" ]; then
  tmp=$(test_dir ctl-real)
  fails_before=$fail
  sed -e "s#/tmp/baton-ctl#$tmp#g" tests/integration/configs/batonctl.yaml >"$tmp/c.yaml"
  "$BUILD/batond" --config "$tmp/c.yaml" >"$tmp/batond.log" 2>&1 &
  daemon=$!
  E=(--endpoint "ipc://$tmp/baton.sock")
  for _ in $(seq 100); do "$CTL" "${E[@]}" --timeout-ms 200 health >/dev/null 2>&1 && break; sleep 0.1; done
  expect_rc 0 "daemon: health" "$CTL" "${E[@]}" health; expect_out "workers ready: cpu0 cpu1" "daemon: health"
  expect_rc 0 "daemon: infer" "$CTL" "${E[@]}" infer hop --input x=i32:2,3:1,2,3,4,5,6
  expect_out "x: i32[2,3] = [[1, 2, 3], [4, 5, 6]]" "daemon: infer"
  expect_rc 0 "daemon: streamed loop" "$CTL" "${E[@]}" --json infer count --stream --input x=i32:1:0 \
    --max-iters count_loop=3
  expect_out '"seq":2,"value":{"name":"it","dtype":"i32","dims":[1],"modality":"tensor","values":[2]}' "daemon: chunks"
  expect_out '"name":"state","dtype":"i32","dims":[3],"modality":"tensor","values":[0,1,2]' "daemon: accumulate"
  expect_out '"loop_ends":{"count_loop":"max_iters"}' "daemon: --json says how the loop ended"
  expect_rc 0 "daemon: loop summary" "$CTL" "${E[@]}" infer count --input x=i32:1:0 --max-iters count_loop=2
  expect_out "count_loop ended by max_iters" "daemon: the summary says how the loop ended"
  # generate finds the graph's input (prompt) through inspect.
  expect_rc 0 "daemon: generate" "$CTL" "${E[@]}" generate say "Hello, world"
  expect_out "Hello, world" "daemon: generate"; expect_out "OK: " "daemon: generate summary"
  # After --, a prompt that begins with - is text, not an option.
  expect_rc 0 "daemon: generate -- -text" "$CTL" "${E[@]}" generate say -- "-not an option"
  expect_out "-not an option" "daemon: generate after --"
  expect_rc 0 "daemon: generate --json" "$CTL" "${E[@]}" --json generate say "hé"
  expect_out '"seq":0,"value":{"name":"prompt","dtype":"u8","dims":[3],"modality":"text","text":"hé"}' \
    "daemon: generate --json"
  # A stop string ends the text before it, and the rest of the request;
  # max-tokens caps it; both say so.  Streamed (generate) and joined (infer).
  expect_rc 0 "daemon: generate --stop" "$CTL" "${E[@]}" generate say "Hello, world" --stop ", w"
  expect_out "Hello" "daemon: generate --stop"; expect_out "text ended by a stop string" "daemon: --stop summary"
  if grep -q "world" <<<"$out"; then bad "daemon: generate --stop sent the text after the stop"; else ok; fi
  expect_rc 0 "daemon: infer --stop" "$CTL" "${E[@]}" --json infer say --input prompt=text:"Hello, world" --stop ", w"
  expect_out '"text":"Hello"' "daemon: infer --stop joins the text up to the stop"
  expect_out '"finish_reason":"stop"' "daemon: infer --stop finish reason"
  expect_rc 0 "daemon: generate --max-tokens" "$CTL" "${E[@]}" generate say "Hello, world" --max-tokens 1
  expect_out "text ended by max-tokens" "daemon: --max-tokens summary"
  expect_rc 1 "daemon: --stop on a graph without text" "$CTL" "${E[@]}" infer hop --input x=i32:1 --stop x
  expect_out "INVALID_ARGUMENT: stop and max_tokens apply to a text stream, and graph 'hop' has none" \
    "daemon: --stop on a graph without text"
  expect_rc 1 "daemon: cancel unknown" "$CTL" "${E[@]}" cancel nosuch-id
  expect_out "NOT_FOUND: no request 'nosuch-id' is in flight" "daemon: cancel unknown"
  expect_rc 1 "daemon: unknown graph" "$CTL" "${E[@]}" infer nosuch; expect_out "NOT_FOUND" "daemon: unknown graph"
  expect_rc 1 "daemon: node failure" "$CTL" "${E[@]}" infer broken --input x=i32:1
  expect_out "INTERNAL: node 'boom' failed: injected failure" "daemon: node failure"
  expect_rc 0 "daemon: stats" "$CTL" "${E[@]}" stats; expect_out "baton_requests_total" "daemon: stats"
  expect_rc 0 "daemon: inspect" "$CTL" "${E[@]}" inspect hop; expect_out "graph hop:" "daemon: inspect"
  "$CTL" "${E[@]}" --timeout-ms 30000 infer slow --input x=i32:1 >"$tmp/int.out" 2>&1 &
  ctl=$!
  # A background job starts with SIGINT ignored until batonctl installs its
  # handler (before it sends): signal only once the request is in flight.
  for _ in $(seq 1 100); do
    "$CTL" "${E[@]}" stats 2>/dev/null | grep -q '^baton_inflight_requests [1-9]' && break
    sleep 0.05
  done
  kill -INT "$ctl"
  wait "$ctl"; rc=$?
  if [ $rc -eq 1 ] && grep -q "CANCELLED" "$tmp/int.out"; then ok
  else bad "batonctl: daemon: Ctrl-C: exit $rc"; cat "$tmp/int.out"; fi
  # batonctl cancel from another connection ends a request in flight.
  "$CTL" "${E[@]}" --timeout-ms 30000 infer slow --input x=i32:1 --request-id slow-op >"$tmp/op.out" 2>&1 &
  ctl=$!
  for _ in $(seq 1 100); do
    "$CTL" "${E[@]}" stats 2>/dev/null | grep -q '^baton_inflight_requests [1-9]' && break
    sleep 0.05
  done
  expect_rc 0 "daemon: cancel" "$CTL" "${E[@]}" cancel slow-op
  expect_out "request slow-op is being cancelled" "daemon: cancel"
  wait "$ctl"; rc=$?
  if [ $rc -eq 1 ] && grep -q "CANCELLED" "$tmp/op.out"; then ok
  else bad "batonctl: daemon: cancelled request: exit $rc"; cat "$tmp/op.out"; fi
  kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null
  keep_on_failure "$tmp" "$fails_before" "$tmp/batond.log"
else
  echo "SKIP: batonctl against batond: $BUILD/batond or $BUILD/baton-worker not built"
  skip=$((skip + 1))
fi

echo "batonctl: ${pass} passed, ${fail} failed, ${skip} skipped"
[ -n "${BATON_TEST_COUNTS_OUT:-}" ] && echo "$pass $fail $skip" >"$BATON_TEST_COUNTS_OUT"
[ "$fail" -eq 0 ]
