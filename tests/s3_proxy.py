#!/usr/bin/env python3
# tests/s3_proxy.py — an HTTP proxy between a daemon and moto for the remote tier's suites
# (tests/moto.c's proxy_start): it forwards every request to moto unchanged (moto checks no
# signature), but
#   - re-pages ListMultipartUploads (GET /<bucket>?uploads): moto ignores max-uploads and
#     answers with every upload at once; here its answer is sorted by key, then upload id, cut
#     after key-marker / upload-id-marker as S3 does (an upload id is looked at only beside
#     its key-marker), and PAGE uploads a page go back, with IsTruncated, NextKeyMarker and
#     NextUploadIdMarker; each page served is a line of STATEDIR/pages.log;
#   - holds a request whose "METHOD path" contains the text of STATEDIR/hold while that file
#     is there, after writing STATEDIR/held (the request line): a test stops a daemon in the
#     middle of a step, sees where, and lets it go on by removing the file.
# stdlib only; run by /usr/bin/python3.
#
# usage: s3_proxy.py PORT UPSTREAM_PORT STATEDIR PAGE
import http.client
import http.server
import os
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

PORT, UPSTREAM, STATE, PAGE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "content-length"}
NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def hold(line):
    """Waits while STATEDIR/hold names a part of line, having said so in STATEDIR/held."""
    path = os.path.join(STATE, "hold")
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
        except FileNotFoundError:
            return
        if not text or text not in line:
            return
        with open(os.path.join(STATE, "held.tmp"), "w") as f:
            f.write(line + "\n")
        os.replace(os.path.join(STATE, "held.tmp"), os.path.join(STATE, "held"))
        time.sleep(0.05)


def page(body, query):
    """moto's whole listing of uploads, as the page that key-marker and upload-id-marker
    ask for."""
    root = ET.fromstring(body)
    ups = sorted((u.findtext(NS + "Key"), u.findtext(NS + "UploadId"))
                 for u in root.iter(NS + "Upload"))
    km = query.get("key-marker", [""])[0]
    im = query.get("upload-id-marker", [""])[0]
    if km:
        ups = [u for u in ups if u[0] > km or (u[0] == km and im and u[1] > im)]
    out, more = ups[:PAGE], len(ups) > PAGE
    xml = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">',
           "<Bucket>%s</Bucket>" % escape(root.findtext(NS + "Bucket") or ""),
           "<KeyMarker>%s</KeyMarker>" % escape(km),
           "<UploadIdMarker>%s</UploadIdMarker>" % escape(im),
           "<MaxUploads>%d</MaxUploads>" % PAGE,
           "<IsTruncated>%s</IsTruncated>" % ("true" if more else "false")]
    if more:
        xml.append("<NextKeyMarker>%s</NextKeyMarker>" % escape(out[-1][0]))
        xml.append("<NextUploadIdMarker>%s</NextUploadIdMarker>" % escape(out[-1][1]))
    for key, uid in out:
        xml.append("<Upload><Key>%s</Key><UploadId>%s</UploadId></Upload>"
                   % (escape(key), escape(uid)))
    xml.append("</ListMultipartUploadsResult>")
    with open(os.path.join(STATE, "pages.log"), "a") as f:
        f.write("key-marker=%s upload-id-marker=%s uploads=%d truncated=%s\n"
                % (km, im, len(out), more))
    return "\n".join(xml).encode()


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                data += self.rfile.read(n)
                self.rfile.readline()
                if n == 0:
                    return data
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def forward(self):
        try:
            self.relay()
        except ConnectionError:
            pass    # the daemon went (killed mid-request): nothing to answer

    def relay(self):
        data = self.body()
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        listing = self.command == "GET" and "uploads" in query and url.path.count("/") == 1
        path = self.path
        if listing:    # moto's whole list: markers and max-uploads are the proxy's
            keep = {k: v for k, v in query.items()
                    if k not in ("key-marker", "upload-id-marker", "max-uploads")}
            path = url.path + "?" + urllib.parse.urlencode(keep, doseq=True)
        hold("%s %s" % (self.command, self.path))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Content-Length"] = str(len(data))
        conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=120)
        conn.request(self.command, path, body=data, headers=headers)
        r = conn.getresponse()
        out = r.read()
        if listing and r.status == 200:
            out = page(out, query)
        self.send_response(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(out)) if self.command != "HEAD" else
                         r.getheader("Content-Length", "0"))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward


http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Proxy).serve_forever()
