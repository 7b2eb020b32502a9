"""``make run``: the whole service on one laptop.

An HTTP server on ``127.0.0.1:$PORT`` turns each request into an API Gateway proxy
event and calls the same Lambda handler ``cdk deploy`` ships; the usage table's stream
reaches the aggregator through a poller (``local/streams.py``) as the event source mapping
delivers it, and the aggregator's sweep and the pricing fetcher run on timers as
EventBridge would run them. Requests signed for Bedrock go to the inference-profile
stand-in (``local/bedrock.py``), which the functions reach through ``AWS_ENDPOINT_URL_BEDROCK``.

Environment: PORT (8080), PROVISIONING_API_KEY (generated when unset),
AGGREGATOR_INTERVAL_SECONDS (600: the sweep), PRICING_REFRESH_INTERVAL_SECONDS (86400),
RATE_LIMITS (on|off), DYNAMODB_ENDPOINT_URL (external DynamoDB instead of the
embedded one), LOCAL_PERSIST (on|off, default on: state under .local/).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .bedrock import ACCOUNT, InferenceProfiles, bedrock_region
from .gateway import LAMBDAS, invoke, invoke_job  # puts the layer on sys.path
from .stack import JWT_SECRET_NAME, PROVISIONING_SECRET_NAME, LocalAws
from .streams import StreamReader, StreamTrigger

from price_keeper.errors import error_body  # noqa: E402
from price_keeper.tables import USAGE_AGG_SHARDED  # noqa: E402

log = logging.getLogger("price_keeper.local")
MAX_BODY = 1_000_000


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "PriceKeeperLocal/1.0"
    # Headers and body are two writes: with Nagle on, a keep-alive client's delayed ACK
    # held every response ~40 ms (measured: 48 ms -> 4 ms per Bedrock call, 51 -> 8 ms per API call).
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.send_error(413)
            return
        body = self.rfile.read(length) if length else None
        region = bedrock_region(self.headers)
        try:
            if region:
                response = self.server.bedrock.respond(self.command, path, region, body)
            else:
                response = invoke(self.command, path, body=body, headers=dict(self.headers.items()), query=query,
                                  source_ip=self.client_address[0])
        except Exception:  # what API Gateway answers when a function crashes outside its resolver
            log.exception("function failed for %s %s", self.command, path)
            response = {"statusCode": 502, "headers": {"Content-Type": "application/json"},
                        "body": json.dumps(error_body("INTERNAL_ERROR", "Function failed"))}
        payload = (response.get("body") or "").encode()
        self.send_response(response["statusCode"])
        headers = {k: v for k, v in (response.get("headers") or {}).items()}
        for name, values in (response.get("multiValueHeaders") or {}).items():
            for value in values:
                if name not in headers:
                    self.send_header(name, value)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def __getattr__(self, name: str):
        """Every method goes to the gateway (unknown ones get its 405/404 in the error schema)."""
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def log_message(self, fmt: str, *args) -> None:  # quieter than the default stderr line
        log.debug("%s %s", self.address_string(), fmt % args)


class LocalHttpServer(ThreadingHTTPServer):
    """The API on ``127.0.0.1:port``, and Bedrock's inference-profile calls for ``bedrock``."""

    daemon_threads = True

    def __init__(self, port: int, bedrock: InferenceProfiles):
        super().__init__(("127.0.0.1", port), _Handler)
        self.bedrock = bedrock


class Timer(threading.Thread):
    """Runs a scheduled function every ``interval`` seconds, like an EventBridge rule."""

    def __init__(self, function: str, interval: float, stop: threading.Event, run_first: bool = False):
        super().__init__(name=f"timer-{function}", daemon=True)
        self.function, self.interval, self.stop_event, self.run_first = function, interval, stop, run_first

    def run(self) -> None:
        if self.run_first:
            self._fire()
        while not self.stop_event.wait(self.interval):
            self._fire()

    def _fire(self) -> None:
        try:
            invoke_job(self.function, {"source": "local.timer", "detail-type": "Scheduled Event"})
        except Exception:  # a failed run is retried at the next tick, as EventBridge would
            log.exception("%s run failed", self.function)


class LocalStack:
    """Embedded AWS + HTTP server + timers; ``start()`` returns once it serves."""

    def __init__(self, port: int | None = None, provisioning_key: str | None = None, persist: bool | None = None):
        self.port = int(port if port is not None else os.environ.get("PORT", "8080"))
        self.requested_key = provisioning_key or os.environ.get("PROVISIONING_API_KEY") or None
        if persist is None:
            persist = os.environ.get("LOCAL_PERSIST", "on") != "off"
        self.aws = LocalAws(persist=persist, dynamodb_endpoint=os.environ.get("DYNAMODB_ENDPOINT_URL"))
        self.stop_event = threading.Event()
        self.httpd: LocalHttpServer | None = None
        self.provisioning_key = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LocalStack":
        os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        os.environ["JWT_SECRET_NAME"] = JWT_SECRET_NAME
        os.environ["PROVISIONING_SECRET_NAME"] = PROVISIONING_SECRET_NAME
        self.aws.start()
        self.aws.ensure_secret(JWT_SECRET_NAME)
        self.provisioning_key = self.aws.ensure_secret(PROVISIONING_SECRET_NAME, self.requested_key)
        self.httpd = LocalHttpServer(self.port, self.aws.bedrock)
        self.port = self.httpd.server_address[1]
        os.environ["AWS_ENDPOINT_URL_BEDROCK"] = self.base_url
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()
        StreamTrigger("aggregator", StreamReader(USAGE_AGG_SHARDED), self.stop_event).start()
        for function, env, default, run_first in (
            ("aggregator", "AGGREGATOR_INTERVAL_SECONDS", 600, False),
            ("pricing_fetcher", "PRICING_REFRESH_INTERVAL_SECONDS", 86400, True),
        ):
            interval = float(os.environ.get(env, default))
            if interval > 0 and (LAMBDAS / function / "handler.py").exists():
                Timer(function, interval, self.stop_event, run_first).start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
        self.aws.stop()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    warnings.filterwarnings("ignore", "No application metrics to publish")  # metrics are off locally
    for noisy in ("botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # moto has no Price List API: the pricing fetcher's call fails there (config prices
    # serve, as when the API is down) and moto's own traceback would only be noise.
    logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
    stack = LocalStack().start()
    print(f"Bedrock Price Keeper is running at {stack.base_url}", flush=True)
    print(f"  API docs:          {stack.base_url}/docs", flush=True)
    print(f"  Spend console:     {stack.base_url}/console", flush=True)
    print(f"  Provisioning key:  {stack.provisioning_key}", flush=True)
    print(f"  Bedrock profiles:  {stack.base_url} as endpoint URL (account {ACCOUNT}; see README)", flush=True)
    print("  Stop with Ctrl-C.", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    stack.stop()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
