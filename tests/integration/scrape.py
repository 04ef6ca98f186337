#!/usr/bin/python3
"""Scrapes a Prometheus /metrics page, parses it with Debian's python3-prometheus-client
(the reference parser) and prints one sample's value, or checks the page only.

  scrape.py URL                    -> "families N samples M" (fails on a parse error)
  scrape.py URL NAME [K=V ...]     -> the sum of NAME's samples whose labels match
"""
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

url = sys.argv[1]
with urllib.request.urlopen(url, timeout=5) as r:
    ctype = r.headers.get("Content-Type", "")
    text = r.read().decode()
assert ctype.startswith("text/plain; version=0.0.4"), ctype
fams = list(text_string_to_metric_families(text))
if len(sys.argv) == 2:
    print("families %d samples %d" % (len(fams), sum(len(f.samples) for f in fams)))
    sys.exit(0)
name = sys.argv[2]
want = dict(a.split("=", 1) for a in sys.argv[3:])
total, found = 0.0, False
for f in fams:
    for s in f.samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
            total += s.value
            found = True
if not found:
    sys.exit("no sample %s %s" % (name, want))
print(repr(total))
