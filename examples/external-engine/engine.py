#!/usr/bin/env python3
"""A stand-in for an external engine (Jenkins, Argo Workflows, a change-approval system), for
`make run` and examples/rollout-webhook.yaml: standard library only, 127.0.0.1 only.

It answers a ballast webhook hook the way a pipeline would: `202 Accepted` at once for a path
that needs a decision (and the work goes on in the background), `200` for a notification. Then,
after DELAY seconds of "work", it decides with the annotation the request's callback names:
approve, or abort when the new images' tag ends in `-bad` (to try a rollback). Calls are
de-duplicated on their Idempotency-Key, as a real engine should: a call sent again after an
operator restart is not worked on twice.

    python3 examples/external-engine/engine.py [--port 8099] [--delay 5]
"""
import argparse
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

seen = set()
lock = threading.Lock()


def decide(call, delay):
    time.sleep(delay)
    cb = call["callback"]
    images = call.get("images", {}).get("to", {}).values()
    verdict = cb["abort"] if any(i.endswith("-bad") for i in images) else cb["approve"]
    cmd = ["kubectl", "annotate", "rolloutstrategy", cb["name"], "-n", cb["namespace"],
           f'{verdict["key"]}={verdict["value"]}', "--overwrite"]
    print("deciding:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)


class Engine(BaseHTTPRequestHandler):
    delay = 5.0

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers.get("Idempotency-Key", "")
        call = json.loads(body or b"{}")
        print(f"{self.path} {key} {call.get('point')} {call.get('toRevision')} "
              f"images={call.get('images', {}).get('to')}", flush=True)
        if self.path.endswith("/done"):
            self.send_response(200)
            self.end_headers()
            return
        with lock:
            first = key not in seen
            seen.add(key)
        if first:
            threading.Thread(target=decide, args=(call, self.delay), daemon=True).start()
        self.send_response(202)
        self.end_headers()
        self.wfile.write(b"queued\n")

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8099)
    p.add_argument("--delay", type=float, default=5.0)
    a = p.parse_args()
    Engine.delay = a.delay
    ThreadingHTTPServer(("127.0.0.1", a.port), Engine).serve_forever()


if __name__ == "__main__":
    main()
