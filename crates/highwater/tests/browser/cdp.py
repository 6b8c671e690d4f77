"""Drives headless Chromium (Debian's `chromium`) over the DevTools protocol
for the browser tests: opens URL, waits until WAIT_JS is truthy, saves a
screenshot to PNG_PATH, and prints the JSON value of RESULT_JS.

    python cdp.py URL PNG_PATH WAIT_JS RESULT_JS [TIMEOUT_S]

Real time, not --virtual-time-budget: MapLibre's module workers do not run
under virtual time. WebGL runs on SwiftShader (--enable-unsafe-swiftshader).
Exits non-zero, saying why, when the page is not ready in time.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket

url, png, wait_js, result_js = sys.argv[1:5]
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
chromium = os.environ.get("HIGHWATER_CHROMIUM") or shutil.which("chromium")
if not chromium:
    sys.exit("chromium is not installed; scripts/test.sh installs Debian's chromium")
profile = tempfile.mkdtemp(prefix="hw-chromium-")
proc = subprocess.Popen(
    [
        chromium, "--headless", "--no-sandbox", "--enable-unsafe-swiftshader",
        "--use-angle=swiftshader", "--window-size=1000,700", "--remote-debugging-port=0",
        "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}", "about:blank",
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
try:
    port_file = os.path.join(profile, "DevToolsActivePort")
    for _ in range(200):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    port = open(port_file).read().split()[0]
    tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
    ws = websocket.create_connection(next(t for t in tabs if t["type"] == "page")["webSocketDebuggerUrl"])
    ws.settimeout(timeout)
    seq = 0
    errors = []

    def call(method, **params):
        global seq
        seq += 1
        ws.send(json.dumps({"id": seq, "method": method, "params": params}))
        while True:
            m = json.loads(ws.recv())
            if m.get("method") == "Runtime.exceptionThrown":
                errors.append(m["params"]["exceptionDetails"].get("exception", {}).get("description"))
            if m.get("id") == seq:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def evaluate(js):
        r = call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    call("Runtime.enable")
    call("Page.enable")
    call("Page.navigate", url=url)
    deadline = time.time() + timeout
    while not evaluate(f"Boolean({wait_js})"):
        if time.time() > deadline:
            state = evaluate("JSON.stringify(document.body ? document.body.dataset : {})")
            sys.exit(f"{url}: not ready after {timeout}s ({wait_js}); body data {state}; errors {errors}")
        time.sleep(0.2)
    shot = call("Page.captureScreenshot", format="png")
    with open(png, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print(json.dumps(evaluate(result_js)))
finally:
    proc.kill()
    proc.wait()
    shutil.rmtree(profile, ignore_errors=True)
