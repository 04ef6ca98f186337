#!/usr/bin/env python3
# cut-proxy.py PORTFILE TARGET_PORT [PORTFILE TARGET_PORT ...]: for each pair, listens
# on a port of 127.0.0.1 it picks (written to PORTFILE) and forwards each connection to
# 127.0.0.1:TARGET_PORT. SIGUSR1 closes every open connection while the listeners stay:
# a network cut that heals at once (the clients reconnect). With CUT_PROXY_ACCEPT=N in
# the environment, each listener closes after its N-th connection (later clients are
# refused; those connected stay). Test traffic only; runs until killed.
import os, selectors, signal, socket, sys
sel = selectors.DefaultSelector()
conns = []
cut = False
def on_usr1(*_):
    global cut
    cut = True
signal.signal(signal.SIGUSR1, on_usr1)
args = sys.argv[1:]
accept_max = int(os.environ.get("CUT_PROXY_ACCEPT", "0"))
accepted = {}
for i in range(0, len(args), 2):
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0)); ls.listen(16); ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ, ("listen", int(args[i + 1])))
    with open(args[i] + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(args[i] + ".tmp", args[i])
def close_pair(pair):
    for s in pair:
        try:
            sel.unregister(s)
        except Exception:
            pass
        s.close()
while True:
    if cut:
        cut = False
        for pair in conns:
            close_pair(pair)
        conns.clear()
    try:
        events = sel.select(0.05)
    except InterruptedError:
        continue
    for key, _ in events:
        kind, arg = key.data
        if kind == "listen":
            c, _ = key.fileobj.accept()
            accepted[key.fileobj] = accepted.get(key.fileobj, 0) + 1
            if accept_max and accepted[key.fileobj] >= accept_max:
                sel.unregister(key.fileobj)
                key.fileobj.close()
            u = socket.create_connection(("127.0.0.1", arg))
            c.setblocking(False); u.setblocking(False)
            sel.register(c, selectors.EVENT_READ, ("pipe", u))
            sel.register(u, selectors.EVENT_READ, ("pipe", c))
            conns.append((c, u))
        else:
            src, dst = key.fileobj, arg
            try:
                data = src.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                for pair in list(conns):
                    if src in pair:
                        conns.remove(pair)
                        close_pair(pair)
                continue
            dst.setblocking(True)
            try:
                dst.sendall(data)
            except OSError:
                pass
            dst.setblocking(False)
