#!/usr/bin/python3
"""Hostile load on a ferry-ps, one case per mode, for tests/integration/test_load.sh.
Each mode prints `key=value` lines (the shell checks and reports them); it raises on a
result that shows a limit missing. Times are printed, not judged here (benchmarks
judge time: bench/load.sh runs this with FERRY_T_TARGETS=1, which checks the latency
targets too).

  load_client.py STUBDIR TARGET jobs N          N joins of world-65536 jobs, one session
  load_client.py STUBDIR TARGET pending C S     C raw HTTP/2 connections, S GetParams
                                                streams each, flow-control window 0
  load_client.py STUBDIR TARGET recover N       a 2-rank recover offering N disjoint steps
  load_client.py STUBDIR TARGET probe N         N probes of a job with checkpoints
  load_client.py STUBDIR TARGET squat           contexts and model bytes, one identity
  load_client.py STUBDIR TARGET fair SECONDS    4 sessions of decoder Forwards; health,
                                                Hello and another identity's steps
  load_client.py STUBDIR TARGET refuse N        N refused calls (wrong token)

Env: FERRY_T_TOKEN (identity a), FERRY_T_TOKEN2 (identity b), FERRY_T_ADMIN (admin).
"""
import os
import socket
import struct
import sys
import threading
import time

import grpc

import grpc_client as g  # noqa: E402  (same argv: STUBDIR TARGET MODE ...)
from grpc_client import pb, Session, f32, i32  # noqa: E402

TARGET, MODE, ARGS = sys.argv[2], sys.argv[3], sys.argv[4:]
TOK, TOK2, ADMIN = (os.environ.get(k) for k in ("FERRY_T_TOKEN", "FERRY_T_TOKEN2", "FERRY_T_ADMIN"))


def out(**kv):
    for k, v in kv.items():
        print("%s=%s" % (k, v), flush=True)


def stats(s, prefix=""):
    r = s.call("Stats", pb.StatsRequest(prefix=prefix))
    return {m.name: m.value for m in r.metrics}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))] if xs else float("nan")


def code(fn):
    try:
        fn()
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


def dense(name, rows, cols):
    cfg = pb.ModuleConfig(dense=pb.DenseConfig(rows=rows, cols=cols), init=pb.Init(seed=1),
                          optimizer=pb.OptimizerConfig(name="sgd", lr=0.1))
    return pb.CreateModuleRequest(name=name, config=cfg)


# ---- jobs: world 65536, memory proportional to the ranks that joined ----------------

def mode_jobs(stub, n):
    s = Session(stub, TOK, "squatter")
    rss0 = stats(s)["rss_bytes"]
    joined, refused, first = 0, 0, ""
    for i in range(n):
        m = pb.JobMember(world=65536, rank=65535 - (i % 7) * 9000, sync=pb.BSP)
        try:
            s.call("Job", pb.JobRequest(job="squat-%d" % i, join=pb.JobJoin(member=m)))
            joined += 1
        except grpc.RpcError as e:
            refused += 1
            if not first:
                first = "%s: %s" % (e.code().name, e.details())
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
    st = stats(s)
    # Another identity still has its own share of jobs.
    b = Session(stub, TOK2, "other")
    b.call("Job", pb.JobRequest(job="b-job", join=pb.JobJoin(
        member=pb.JobMember(world=65536, rank=0, sync=pb.BSP))))
    out(jobs_joined=joined, jobs_refused=refused, first_refusal='"%s"' % first,
        jobs_held=int(st["jobs"]), job_bytes=int(st["job_bytes"]),
        rss_growth_mb="%.1f" % ((st["rss_bytes"] - rss0) / 2**20), other_identity_join="OK")


# ---- replies nobody reads: raw HTTP/2 with a zero flow-control window --------------

def hpack_int(v, prefix_bits, first=0):
    lim = (1 << prefix_bits) - 1
    if v < lim:
        return bytes([first | v])
    b = [first | lim]
    v -= lim
    while v >= 128:
        b.append((v & 127) | 128)
        v >>= 7
    b.append(v)
    return bytes(b)


def hpack_literal(name, value):
    # Literal header field without indexing, new name, no Huffman coding.
    n, v = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(n), 7) + n + hpack_int(len(v), 7) + v


def frame(ftype, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


class RawConn:
    """One HTTP/2 connection that asks and never reads: SETTINGS_INITIAL_WINDOW_SIZE 0,
    no WINDOW_UPDATE ever; it answers SETTINGS and PING so the server keeps it open."""

    def __init__(self, host, port, session, nstreams, module):
        self.sock = socket.create_connection((host, port), timeout=5)
        self.ended, self.reset, self.data = set(), set(), 0
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack(">HI", 4, 0)))
        req = pb.GetParamsRequest(module=module).SerializeToString()
        for k in range(nstreams):
            sid = 1 + 2 * k
            hdr = b"".join(hpack_literal(a, b) for a, b in (
                (":method", "POST"), (":scheme", "http"), (":path", "/ferry.v1.Ferry/GetParams"),
                (":authority", "%s:%d" % (host, port)), ("content-type", "application/grpc"),
                ("te", "trailers"), ("authorization", "Bearer " + TOK), ("ferry-session", session)))
            self.sock.sendall(frame(1, 4, sid, hdr) + frame(0, 1, sid, b"\x00" + struct.pack(">I", len(req)) + req))
        self.stop = False
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self):
        buf = b""
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while len(buf) >= 9:
                n = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + n:
                    break
                ftype, flags, sid = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                payload, buf = buf[9:9 + n], buf[9 + n:]
                if ftype == 4 and not flags & 1:
                    self.sock.sendall(frame(4, 1, 0, b""))  # SETTINGS ack
                elif ftype == 6 and not flags & 1:
                    self.sock.sendall(frame(6, 1, 0, payload))  # PING ack
                elif ftype == 1 and flags & 1:
                    self.ended.add(sid)  # trailers: the call ended (refused, or done)
                elif ftype == 3:
                    self.reset.add(sid)  # RST_STREAM: the server cancelled it
                elif ftype == 0:
                    self.data += n

    def close(self):
        self.stop = True
        self.t.join()
        self.sock.close()


def mode_pending(stub, nconn, nstreams):
    s = Session(stub, TOK, "reader-that-never-reads")
    s.call("CreateModule", dense("big/block", 4096, 1024))  # 16 MiB a GetParams reply
    st0 = stats(s)
    host, port = TARGET.rsplit(":", 1)
    conns = [RawConn(host, int(port), s.id, nstreams, "big/block") for _ in range(nconn)]
    time.sleep(1.5)
    st = stats(s)
    held = st["unread_reply_bytes"]
    ended = sum(len(c.ended) for c in conns)
    asked = nconn * nstreams
    # Health and an ordinary reader are served meanwhile.
    hs = g.health_pb2_grpc.HealthStub(g.channel())
    h = hs.Check(g.health_pb2.HealthCheckRequest(service=""), timeout=5).status
    small = code(lambda: s.call("GetParams", pb.GetParamsRequest(module="big/block", row_begin=0,
                                                                  row_count=1)))
    # The server cancels what nobody read after --reply-timeout.
    t0 = time.time()
    while time.time() - t0 < 30:
        st2 = stats(s)
        if st2["unread_reply_bytes"] == 0:
            break
        time.sleep(0.25)
    reset = sum(len(c.reset) for c in conns)
    data = sum(c.data for c in conns)
    for c in conns:
        c.close()
    if held > st["budget_unread_reply_bytes"]:
        raise SystemExit("held %d bytes over the %d budget" % (held, st["budget_unread_reply_bytes"]))
    out(pending_asked=asked, pending_held_mb="%.1f" % (held / 2**20),
        pending_budget_mb="%.0f" % (st["budget_unread_reply_bytes"] / 2**20),
        pending_refused=int(st["replies_refused_unread"] - st0["replies_refused_unread"]),
        pending_ended_at_once=ended, pending_cancelled=int(st2["replies_cancelled_unread"]),
        pending_reset_seen=reset, pending_after_mb="%.1f" % (st2["unread_reply_bytes"] / 2**20),
        pending_cancel_s="%.1f" % (time.time() - t0), pending_data_bytes_sent=data,
        health_meanwhile=g.health_pb2.HealthCheckResponse.ServingStatus.Name(h),
        small_read_meanwhile=small)


# ---- recover: n log n in what it is sent ---------------------------------------------

def mode_recover(stub, n):
    r0, r1 = Session(stub, TOK, "rank0"), Session(stub, TOK, "rank1")
    mem = lambda r: pb.JobMember(world=2, rank=r, sync=pb.BSP, sync_timeout_ms=20000)  # noqa
    for r, s in enumerate((r0, r1)):
        s.call("Job", pb.JobRequest(job="rec", join=pb.JobJoin(member=mem(r))))
    half = n // 2
    evens = [2 * i + 2 for i in range(half)]
    odds = [2 * i + 1 for i in range(half)]
    f0 = r0.future("Job", pb.JobRequest(job="rec", recover=pb.JobRecover(member=mem(0), checkpoints=evens)),
                   timeout=30)
    time.sleep(0.3)
    lat = []
    done = threading.Event()

    def poll():  # a Stats call behind the recover
        o = Session(stub, TOK2, "stats")
        while not done.is_set():
            t = time.time()
            o.call("Stats", pb.StatsRequest(prefix="jobs"))
            lat.append(time.time() - t)
    th = threading.Thread(target=poll)
    th.start()
    t = time.time()
    c1 = code(lambda: r1.call("Job", pb.JobRequest(job="rec", recover=pb.JobRecover(
        member=mem(1), checkpoints=odds)), timeout=30))
    took = time.time() - t
    c0 = code(f0.result)
    time.sleep(0.2)
    done.set()
    th.join()
    # No common step: the barrier answers both with NOT_FOUND (nothing to roll back to).
    if c1 != "NOT_FOUND" or c0 != "NOT_FOUND":
        raise SystemExit("recover answered %s / %s, want NOT_FOUND for disjoint offers" % (c0, c1))
    out(recover_steps=2 * half, recover_bytes=len(pb.JobRecover(member=mem(1), checkpoints=odds)
                                                  .SerializeToString()) * 2,
        recover_ms="%.1f" % (took * 1e3), stats_meanwhile_max_ms="%.1f" % (max(lat) * 1e3),
        recover_answer=c1)
    if os.environ.get("FERRY_T_TARGETS") and took > 0.1:
        raise SystemExit("recover of %d steps took %.0f ms (target 100)" % (n, took * 1e3))


# ---- probe: answered from a manifest, rate-limited ----------------------------------

def mode_probe(stub, n):
    s = Session(stub, TOK, "prober")
    s.call("CreateModule", dense("pj/block", 4096, 1024))  # 16 MiB a checkpoint
    mem = pb.JobMember(world=1, rank=0, sync=pb.BSP)
    s.call("Job", pb.JobRequest(job="pj", join=pb.JobJoin(member=mem)))
    s.call("Job", pb.JobRequest(job="pj", ready=pb.JobReady(rank=0)))
    adm = Session(stub, ADMIN, "admin")
    for step in (1, 2, 3, 4):
        s.call("Job", pb.JobRequest(job="pj", checkpoint=pb.JobCheckpoint(rank=0, step=step)), timeout=30)
        adm.call("SetParams", pb.SetParamsRequest(  # a change, so the next one is written anew
            module="pj/block", row_begin=0, tensors=[f32([1, 1024], [float(step)] * 1024, "weight")]))
    st0 = stats(s, "probe_")
    p = Session(stub, TOK, "prober2")
    lat, hello = [], []
    done = threading.Event()

    def hellos():  # Hello renewing one session (a new session each time would be capped)
        h = Session(stub, TOK2, "hello")
        while not done.is_set():
            t = time.time()
            h.call("Hello", pb.HelloRequest(label="hello", contract_major=1))
            hello.append(time.time() - t)
    th = threading.Thread(target=hellos)
    th.start()
    ok = refused = 0
    steps = []
    for _ in range(n):
        t = time.time()
        try:
            r = p.call("Job", pb.JobRequest(job="pj", probe=pb.JobProbe()))
            steps = list(r.checkpoints)
            ok += 1
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            refused += 1
        lat.append(time.time() - t)
    done.set()
    th.join()
    st = stats(s, "probe_")
    if steps != [1, 2, 3, 4]:
        raise SystemExit("probe listed %s, want [1, 2, 3, 4]" % steps)
    read = st["probe_bytes_read"] - st0["probe_bytes_read"]
    out(probes=n, probes_answered=ok, probes_refused=refused,
        probe_bytes_read_mb="%.1f" % (read / 2**20),
        probe_files_verified=int(st["probe_files_verified"]),
        probe_files_from_manifest=int(st["probe_files_from_manifest"]),
        probe_median_ms="%.2f" % (pct(lat, 50) * 1e3),
        hello_p99_during_probes_ms="%.1f" % (pct(hello, 99) * 1e3))


def mode_probe_again(stub):
    # After the shell changed a checkpoint file: its step is verified again, and dropped.
    s = Session(stub, TOK, "prober3")
    r = s.call("Job", pb.JobRequest(job="pj", probe=pb.JobProbe()))
    out(probe_after_change=",".join(str(x) for x in r.checkpoints))


# ---- squatting: per-identity contexts and model bytes --------------------------------

def mode_squat(stub):
    a = Session(stub, TOK, "squatter")
    b = Session(stub, TOK2, "trainer-b")
    adm = Session(stub, ADMIN, "admin")
    a.call("CreateModule", g.embedding("a/emb"))
    b.call("CreateModule", g.embedding("b/emb"))
    budget = stats(a)
    per_id = int(budget["budget_contexts_per_identity"])
    opened, first = 0, ""
    for i in range(per_id + 64):
        try:
            a.call("Forward", pb.ForwardRequest(ctx_id=0x100000 + i, call_id=1, module="a/emb",
                                                tensors=[i32("ids", [1])]))
            opened += 1
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            first = e.details()
            break
    # identity b trains on: a forward, backward and step of its own.
    ctx = 0x77
    b.call("Forward", pb.ForwardRequest(ctx_id=ctx, call_id=1, module="b/emb", tensors=[i32("ids", [1])]))
    b.call("Backward", pb.BackwardRequest(ctx_id=ctx, call_id=1, module="b/emb",
                                          tensors=[f32([1, 4], [1.0, 1.0, 1.0, 1.0], "grad")]))
    b.call("Step", pb.StepRequest(ctx_id=ctx, scale=1.0))
    # Model bytes: a's modules until its budget is spent; an admin's DeleteModule gives
    # the budget back.
    made = 0
    mb = int(budget["budget_model_bytes_per_identity"])
    for i in range(64):
        c = code(lambda: a.call("CreateModule", dense("a/block%d" % i, 1024, 1024)))  # 4 MiB
        if c == "RESOURCE_EXHAUSTED":
            break
        if c != "OK":
            raise SystemExit("CreateModule: " + c)
        made += 1
    b_made = code(lambda: b.call("CreateModule", dense("b/block", 1024, 1024)))
    freed = adm.call("DeleteModule", pb.DeleteModuleRequest(name="a/block0")).bytes
    again = code(lambda: a.call("CreateModule", dense("a/block-again", 1024, 1024)))
    gone = code(lambda: a.call("GetParams", pb.GetParamsRequest(module="a/block0")))
    listed = len(a.call("ListModules", pb.ListModulesRequest(prefix="a/")).modules)
    not_owner = code(lambda: b.call("DeleteModule", pb.DeleteModuleRequest(name="a/block1")))
    if (opened != per_id or b_made != "OK" or again != "OK" or gone != "NOT_FOUND"
            or not_owner != "NOT_FOUND"):
        raise SystemExit("squat: opened %d of %d, b %s, again %s, gone %s"
                         % (opened, per_id, b_made, again, gone))
    out(contexts_opened=opened, contexts_per_identity=per_id, contexts_refusal='"%s"' % first,
        other_identity_step="OK", modules_made=made,
        model_mb_per_identity="%.0f" % (mb / 2**20), other_identity_module=b_made,
        delete_freed_mb="%.1f" % (freed / 2**20), create_after_delete=again,
        deleted_module_call=gone, modules_listed=listed, delete_by_other_identity=not_owner)


# ---- fairness: cheap calls and another identity under a flood of Forwards -----------

def mode_fair(stub, seconds):
    a = Session(stub, TOK, "flood")
    a.call("CreateModule", pb.CreateModuleRequest(name="f/dec", config=pb.ModuleConfig(
        decoder=pb.DecoderConfig(vocab=10000, hidden=650), init=pb.Init(seed=2))))
    b = Session(stub, TOK2, "trainer-b")
    b.call("CreateModule", g.embedding("fb/emb"))
    hs = g.health_pb2_grpc.HealthStub(g.channel())
    N = 800  # 2 MiB of hidden states a Forward, as the campaign sent
    hidden = f32([N, 650], [0.01] * (N * 650), "hidden")
    targets = i32("targets", list(range(N)))

    def b_step(k):
        t = time.time()
        ctx = 0x500000 + k
        b.call("Forward", pb.ForwardRequest(ctx_id=ctx, call_id=1, module="fb/emb", tensors=[i32("ids", [1])]))
        b.call("Backward", pb.BackwardRequest(ctx_id=ctx, call_id=1, module="fb/emb",
                                              tensors=[f32([1, 4], [0.0] * 4, "grad")]))
        b.call("Step", pb.StepRequest(ctx_id=ctx, scale=1.0))
        return time.time() - t

    h = Session(stub, TOK2, "hello")

    def probe_all(secs, tag):
        health, hello, steps = [], [], []
        t_end = time.time() + secs
        k = 0
        while time.time() < t_end:
            t = time.time()
            hs.Check(g.health_pb2.HealthCheckRequest(service=""), timeout=10)
            health.append(time.time() - t)
            t = time.time()
            h.call("Hello", pb.HelloRequest(label="hello", contract_major=1))
            hello.append(time.time() - t)
            steps.append(b_step(k + (1000000 if tag else 0)))
            k += 1
            time.sleep(0.02)
        return health, hello, steps

    # Alone first: the baseline.
    base = probe_all(min(3.0, seconds / 3), 0)
    one = []

    def flood(s, stop):
        while not stop.is_set():
            t = time.time()
            s.call("Forward", pb.ForwardRequest(module="f/dec", no_grad=True, tensors=[hidden, targets]),
                   timeout=60)
            one.append(time.time() - t)
    stop = threading.Event()
    # Daemon threads, stopped in `finally`: a probe that raises (a refusal, a lapsed
    # session) fails the case at once instead of leaving the floods running forever.
    floods = [threading.Thread(target=flood, args=(Session(stub, TOK, "flood%d" % i), stop),
                               daemon=True) for i in range(4)]
    for t in floods:
        t.start()
    try:
        time.sleep(1.0)
        loaded = probe_all(seconds, 1)
    finally:
        stop.set()
        for t in floods:
            t.join(timeout=120)
    # The joins wait for the Forwards in flight (seconds under the sanitizers), longer
    # than the test's --session-ttl: h may have lapsed, so Stats goes on a new session.
    q = stats(Session(stub, TOK2, "stats"), "queue_")
    res = dict(
        fair_forward_ms="%.0f" % (pct(one, 50) * 1e3), fair_forwards=len(one),
        health_p50_ms="%.1f" % (pct(loaded[0], 50) * 1e3), health_p99_ms="%.1f" % (pct(loaded[0], 99) * 1e3),
        hello_p50_ms="%.1f" % (pct(loaded[1], 50) * 1e3), hello_p99_ms="%.1f" % (pct(loaded[1], 99) * 1e3),
        other_step_alone_ms="%.2f" % (pct(base[2], 50) * 1e3),
        other_step_loaded_ms="%.2f" % (pct(loaded[2], 50) * 1e3),
        other_step_loaded_p90_ms="%.2f" % (pct(loaded[2], 90) * 1e3),
        health_alone_p99_ms="%.1f" % (pct(base[0], 99) * 1e3), samples=len(loaded[0]),
        queue_wait_max_s="%.2f" % q.get("queue_wait_max_s", -1))
    out(**res)
    if os.environ.get("FERRY_T_TARGETS"):
        bad = []
        if pct(loaded[0], 99) > 0.05:
            bad.append("health p99 %.0f ms > 50" % (pct(loaded[0], 99) * 1e3))
        if pct(loaded[1], 99) > 0.1:
            bad.append("Hello p99 %.0f ms > 100" % (pct(loaded[1], 99) * 1e3))
        if bad:
            raise SystemExit("; ".join(bad))


# ---- refusals: the log grows by a bounded rate ---------------------------------------

def mode_refuse(stub, n):
    bad = Session.__new__(Session)
    bad.stub, bad.token, bad.label, bad.id = stub, "x" * 32, "wrong", ""
    codes = {}
    for _ in range(n):
        c = code(lambda: bad.call("Stats", pb.StatsRequest()))
        codes[c] = codes.get(c, 0) + 1
    if codes != {"UNAUTHENTICATED": n}:
        raise SystemExit("refusals: %s" % codes)
    out(refused_calls=n)


def main():
    stub = g.ferry_pb2_grpc.FerryStub(g.channel())
    if MODE == "jobs":
        return mode_jobs(stub, int(ARGS[0]))
    if MODE == "pending":
        return mode_pending(stub, int(ARGS[0]), int(ARGS[1]))
    if MODE == "recover":
        return mode_recover(stub, int(ARGS[0]))
    if MODE == "probe":
        return mode_probe(stub, int(ARGS[0]))
    if MODE == "probe-again":
        return mode_probe_again(stub)
    if MODE == "squat":
        return mode_squat(stub)
    if MODE == "fair":
        return mode_fair(stub, float(ARGS[0]))
    if MODE == "refuse":
        return mode_refuse(stub, int(ARGS[0]))
    raise SystemExit("unknown mode " + MODE)


if __name__ == "__main__":
    main()
