#!/usr/bin/python3
"""A test HTTP(S) server on 127.0.0.1 for dhp's network tests.

Serves files under --root, plus misbehaving paths:
  /never/...     accepts the request and never answers
  /slow/...      a 1 MB body at 10 bytes per second
  /endless/...   200 without a length, zeros until the client hangs up
  /2gb/...       Content-Length: 2147483648, zeros until the client hangs up
  /loop/...      302 to itself
  /downgrade/... 302 to --downgrade-to (an http:// URL)
  /gated/...     401 unless "Authorization: Bearer good-token"
Writes the port it bound to --port-file and exits by itself after --lifetime
seconds, so a test that dies cannot leave it running."""
import argparse
import http.server
import os
import ssl
import sys
import threading
import time

ARGS = None
TOKEN = "good-token"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_zeros(self, limit):
        chunk = b"\0" * 65536
        sent = 0
        try:
            while sent < limit:
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        p = self.path
        if p.startswith("/never/"):
            time.sleep(ARGS.lifetime)
            return
        if p.startswith("/slow/"):
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            try:
                for _ in range(10 * ARGS.lifetime):
                    self.wfile.write(b"{")
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        if p.startswith("/endless/") or p.startswith("/2gb/"):
            self.send_response(200)
            if p.startswith("/2gb/"):
                self.send_header("Content-Length", str(2 << 30))
            else:
                self.send_header("Connection", "close")
            self.end_headers()
            self.send_zeros(2 << 30)
            return
        if p.startswith("/loop/"):
            self.redirect(p)
            return
        if p.startswith("/downgrade/"):
            self.redirect(ARGS.downgrade_to)
            return
        if p.startswith("/gated/") and self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.reply(401, b'{"error": "Access to model gated/Model is restricted."}\n')
            return
        path = os.path.realpath(os.path.join(ARGS.root, p.lstrip("/").split("?")[0]))
        if not path.startswith(os.path.realpath(ARGS.root) + os.sep) or not os.path.isfile(path):
            self.reply(404, b"Entry not found\n")
            return
        with open(path, "rb") as f:
            self.reply(200, f.read())

    def redirect(self, to):
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--lifetime", type=int, default=300)
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    ap.add_argument("--downgrade-to", default="http://127.0.0.1:9/")
    ARGS = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    if ARGS.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*ARGS.tls)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Timer(ARGS.lifetime, lambda: os._exit(0)).start()
    tmp = ARGS.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, ARGS.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
