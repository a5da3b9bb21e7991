"""An HTTP proxy in front of an S3-compatible server that gives every request
the latency of a memwal store profile (memwal::testing::LatencyProfile):
for peers that cannot take memwal's Rust wrapper, so they see the same store
model over the real S3 protocol. Same parameters, same request shapes:

- PUT, and POST (multipart create and complete): the PUT delay;
- GET and HEAD of an object: the GET delay (first byte);
- GET of a bucket (ListObjects): the LIST delay;
- DELETE, and POST ?delete (DeleteObjects): the DELETE delay;
- plus the request's body bytes (either way) at the profile's bandwidth.

Delays are log-normal through the profile's p50 and p99, capped at 10x p99,
drawn from one generator seeded with --seed (a different generator from the
Rust one, so the draws are not the same numbers, only the same
distribution). The upstream server's own time counts toward the delay.
Requests never queue behind each other. `GET /__counts` answers the
requests, bytes, delays and upstream time of each kind so far, as JSON.

    python s3_latency_proxy.py --upstream http://127.0.0.1:5000 --port 5001 \\
        --profile s3-standard
"""

import argparse
import http.client
import json
import math
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# name: (put, get, list, delete) as (p50 ms, p99 ms), bytes per second
PROFILES = {
    "s3-standard": ({"put": (50, 150), "get": (25, 100), "list": (40, 120),
                     "delete": (30, 100)}, 80e6),
    "s3-express": ({"put": (6, 15), "get": (3, 8), "list": (5, 15),
                    "delete": (4, 10)}, 100e6),
}
Z_99 = 2.326347874

p = argparse.ArgumentParser()
p.add_argument("--upstream", required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--profile", choices=sorted(PROFILES), default="s3-standard")
p.add_argument("--seed", type=int, default=1)
args = p.parse_args()

delays, bytes_per_s = PROFILES[args.profile]
upstream = urlsplit(args.upstream)
rng = random.Random(args.seed)
lock = threading.Lock()
counts = {k: {"requests": 0, "bytes": 0, "waited_ms": 0.0, "upstream_ms": 0.0}
          for k in ["put", "get", "head", "list", "delete", "copy"]}


def draw(kind):
    p50, p99 = delays[kind]
    sigma = math.log(max(p99 / p50, 1.0)) / Z_99
    with lock:
        z = rng.gauss(0.0, 1.0)
    return min(p50 * math.exp(sigma * z), 10 * p99) / 1e3


def kind_of(method, path, query, headers):
    if method == "DELETE" or (method == "POST" and "delete" in query.split("&")):
        return "delete", "delete"
    if method in ("PUT", "POST"):
        if method == "PUT" and "x-amz-copy-source" in headers:
            return "copy", "delete"
        return "put", "put"
    key = path.lstrip("/").split("/", 1)[1:] or [""]
    if method == "GET" and key[0] == "":
        return "list", "list"
    return ("head" if method == "HEAD" else "get"), "get"


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def handle_any(self):
        if self.path == "/__counts":
            with lock:
                data = json.dumps(counts).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        length = self.headers.get("Content-Length")
        if length is not None:
            body = self.rfile.read(int(length))
        elif self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
                body += chunk
        else:
            body = b""
        path, _, query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        kind, delay_kind = kind_of(self.command, path, query, headers)
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=300)
        out = {k: v for k, v in self.headers.items()
               if k.lower() not in ("transfer-encoding", "content-length", "connection")}
        out["Content-Length"] = str(len(body))
        started = time.monotonic()
        conn.request(self.command, self.path, body=body, headers=out)
        resp = conn.getresponse()
        data = resp.read()
        upstream_s = time.monotonic() - started
        moved = len(body) + (len(data) if kind == "get" else 0)
        waited = draw(delay_kind) + moved / bytes_per_s
        with lock:
            c = counts[kind]
            c["requests"] += 1
            c["bytes"] += moved
            c["waited_ms"] += waited * 1e3
            c["upstream_ms"] += upstream_s * 1e3
        # The request takes the profile's delay from when it arrived: the
        # loopback server's own time (milliseconds per request in Python,
        # where the Rust wrapper's local disk adds a fraction of one) counts
        # toward the delay instead of on top of it; it is the harness's
        # cost, not S3's.
        time.sleep(max(0.0, waited - upstream_s))
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "content-length", "connection", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


server = ThreadingHTTPServer(("127.0.0.1", args.port), Proxy)
server.daemon_threads = True
server.serve_forever()
