"""The spend console (GET /console) in a real browser: headless Chromium driven by Selenium
against the local server (``python -m local``, aggregator every second).

An app reports usage that prices to exactly $1.12 on ``premium``; its owner signs in with
the keyboard and sees that, the other labels, the 30-day chart and a CSV identical to the
API's; the page renews a refused access token with its refresh token, keeps tokens out of
storage, cookies and URLs, and revokes them on sign-out. An operator signs in with the
org's credentials at phone width and sees the app and today's alerts, with nothing
overflowing. Every request the browser made went to the local server only.

An operator enters the provisioning key and a UTC day and sees the reconciliation:
a wrong key is refused with the 401 in the alert region, an empty day says so, and after two
calls the local Bedrock stand-in counted but nobody reported, the day's table is the API's reply
row for row; the key never reaches a URL, storage or the document.

The browser is ``tests/browser.py``'s, which skips these tests, saying why, without Chromium.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import pytest
import requests

# selenium after tests.browser, which skips this module, saying why, where it is missing
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import WAIT_SECONDS, Browser
from tests.local_server import eventually, reconciling_server
from tests.tenants import new_tenant, tokens

pytestmark = pytest.mark.e2e

KEY = "e2e-console-provisioning-key"
APP_ID = "checkout"
ORG_QUOTAS = {"premium": 10_000_000, "standard": 5_000_000, "economy": 2_000_000}
APP_QUOTAS = {"premium": 1_250_000, "standard": 2_000_000, "economy": 150_000}
# config.yaml fallback prices (micro-USD per 1M tokens): premium 800,000 in / 3,200,000 out,
# standard 330,000 / 2,750,000, economy 35,000 / 140,000. The pricing fetcher is off.
USAGE = [  # (label, model id, input tokens, output tokens, expected cost in micro-USD)
    ("premium", "amazon.nova-pro-v1:0", 600_000, 50_000, 640_000),
    ("premium", "amazon.nova-pro-v1:0", 400_000, 50_000, 480_000),  # premium: 1,120,000 = $1.12, 89.6 %
    ("standard", "amazon.nova-2-lite-v1:0", 1_000_000, 80_000, 550_000),
    # economy: 4 x 35,000 = 140,000, 93.3 %: TIGHT at the app's 90 % (records stay within the token caps)
    *[("economy", "amazon.nova-micro-v1:0", 1_000_000, 0, 35_000)] * 4,
]
PREMIUM_MICROS = 1_120_000


def dollars(micros: int) -> str:
    """The page's rendering: cents rounded half up."""
    cents = (micros + 5_000) // 10_000
    return f"${cents // 100:,}.{cents % 100:02d}"


# --- the service, provisioned and spent on --------------------------------------------


class World:
    def __init__(self, base_url: str):
        self.base_url = base_url
        self.tenant = new_tenant(
            base_url,
            KEY,
            {
                APP_ID: {
                    "app_name": "Checkout",
                    "model_ordering": ["premium", "standard", "economy"],
                    "quotas": APP_QUOTAS,
                    "overrides": {"tight_mode_threshold_pct": 90},
                }
            },
            org_name="Console e2e",
            timezone="Europe/Paris",
            quotas=ORG_QUOTAS,
        )
        self.org_id = self.tenant.org_id
        self.org_credentials, self.app_credentials = self.tenant.credentials[None], self.tenant.credentials[APP_ID]

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def tokens(self, credentials: dict) -> dict:
        return tokens(self.base_url, credentials)

    def get(self, path: str, access: str, **params) -> requests.Response:
        return requests.get(self.url(path), params=params, headers={"Authorization": f"Bearer {access}"}, timeout=10)

    def spend(self) -> None:
        access = self.tokens(self.app_credentials)["access_token"]
        stamp = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        for label, model, input_tokens, output_tokens, cost in USAGE:
            reply = requests.post(
                self.url(f"api/v1/orgs/{self.org_id}/apps/{APP_ID}/usage"),
                timeout=10,
                headers={"Authorization": f"Bearer {access}"},
                json={
                    "request_id": str(uuid.uuid4()),
                    "model_label": label,
                    "bedrock_model_id": model,
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "status": "OK",
                    "timestamp": stamp,
                },
            )
            assert reply.status_code == 202, reply.text
            assert reply.json()["processing"]["cost_usd_micros"] == cost, reply.text
        # The aggregator (every second here) folds the shards and fires the two 80 % alerts.
        org_access = self.tokens(self.org_credentials)["access_token"]

        def folded():
            today = self.get(f"api/v1/orgs/{self.org_id}/apps/{APP_ID}/aggregates/today", access).json()
            costs = {label: model["cost_usd_micros"] for label, model in today["models"].items()}
            return costs == {"premium": PREMIUM_MICROS, "standard": 550_000, "economy": 140_000}

        eventually(folded, "the aggregator to fold the usage")
        eventually(
            lambda: len(self.get(f"api/v1/orgs/{self.org_id}/alerts", org_access).json()["alerts"]) == 2,
            "the two threshold alerts",
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console")
    # The reconciler (every second) counts Bedrock's calls once the late-report tolerance has passed: 5 s here.
    with reconciling_server(folder, KEY) as base_url:
        spent = World(base_url)
        spent.spend()
        yield spent


# --- the browser -------------------------------------------------------------------------


class ConsoleBrowser(Browser):
    """The console's page: its state, sign-in, tables and storage."""

    def state(self) -> str:
        return self.js("return document.getElementById('main').dataset.state")

    def wait_ready(self) -> None:
        WebDriverWait(self.driver, WAIT_SECONDS).until(lambda _: self.state() in ("ready", "error"))
        assert self.state() == "ready", self.js("return document.getElementById('error').textContent")

    def click(self, element_id: str) -> None:
        self.driver.find_element(By.ID, element_id).click()

    def focused(self) -> str:
        return self.driver.switch_to.active_element.get_attribute("id")

    def sign_in_with_keyboard(self, credentials: dict) -> None:
        """Type into the focused client ID field, Tab to the secret, Enter to submit."""
        assert self.focused() == "client_id"
        ActionChains(self.driver).send_keys(credentials["client_id"]).send_keys(Keys.TAB).perform()
        assert self.focused() == "client_secret"
        ActionChains(self.driver).send_keys(credentials["client_secret"]).send_keys(Keys.ENTER).perform()
        WebDriverWait(self.driver, WAIT_SECONDS).until(lambda _: self.state() != "signed-out" or self.text("error"))
        if self.state() != "signed-out":
            self.wait_ready()

    def label_rows(self) -> dict[str, dict]:
        return {
            row["label"]: row
            for row in self.js("""
            return [...document.querySelectorAll('#labels tbody tr')].map(tr => ({
              label: tr.dataset.label, spend: tr.querySelector('.spend').textContent,
              quota: tr.querySelector('.quota').textContent, pct: tr.querySelector('.pct').textContent,
              requests: tr.querySelector('.requests').textContent,
              status: tr.querySelector('.quota-status').textContent}))""")
        }

    def text(self, element_id: str) -> str:
        return self.driver.find_element(By.ID, element_id).text

    def storage(self) -> dict:
        return self.js("""return {local: JSON.stringify({...localStorage}),
                                  session: JSON.stringify({...sessionStorage}), cookie: document.cookie}""")


@pytest.fixture
def browser(tmp_path):
    with ConsoleBrowser(tmp_path) as opened:
        yield opened


def assert_only_local_requests(browser: Browser, base_url: str, secrets: list[str]) -> None:
    sent = browser.requests_sent()
    assert sent, "the browser made no request at all"
    assert browser.requests_elsewhere(base_url) == [], "a request left the server"
    for request in sent:
        for secret in secrets:
            assert secret not in request["url"], "a secret or token was put in a URL"
    for event in browser.network():
        if event["method"] == "Network.responseReceived":
            headers = {name.lower() for name in event["params"]["response"]["headers"]}
            assert "set-cookie" not in headers


def assert_tokens_only_in_memory(browser: Browser, secrets: list[str]) -> None:
    stored = browser.storage()
    assert stored == {"local": "{}", "session": "{}", "cookie": ""}, stored
    page = browser.driver.page_source
    for secret in secrets:
        assert secret not in page, "a secret or token is in the document"


# Text must reach WCAG AA: 4.5:1, or 3:1 for large text (24 px, or 18.66 px bold).
CONTRAST_SCRIPT = """
const luminance = (rgb) => {
  const [r, g, b] = rgb.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const parse = (colour) => (colour.match(/[\\d.]+/g) || []).map(Number);
const background = (node) => {
  for (let n = node; n && n.nodeType === 1; n = n.parentElement) {
    const c = parse(getComputedStyle(n).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const failures = [];
for (const node of document.querySelectorAll('body *')) {
  const text = [...node.childNodes].filter(c => c.nodeType === 3).map(c => c.textContent).join('').trim();
  if (!text || !node.getClientRects().length || node.closest('[hidden], .visually-hidden, button:disabled')) continue;
  const style = getComputedStyle(node);
  if (style.visibility === 'hidden') continue;
  const fg = parse(node instanceof SVGElement ? style.fill : style.color).slice(0, 3);
  const [l1, l2] = [luminance(fg), luminance(background(node))].sort((a, b) => b - a);
  const ratio = (l1 + 0.05) / (l2 + 0.05);
  const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
  const needed = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
  if (ratio < needed) failures.push(`${node.tagName} "${text.slice(0, 30)}" ${ratio.toFixed(2)}`);
}
return failures;
"""

OVERFLOW_SCRIPT = """
const width = document.documentElement.clientWidth;
const wide = [...document.querySelectorAll('body *')].filter(n => {
  const r = n.getBoundingClientRect();
  return r.width > 0 && (r.right > width + 0.5 || r.left < -0.5) && !n.closest('.visually-hidden, thead');
}).map(n => `${n.tagName}#${n.id}.${n.className} ${Math.round(n.getBoundingClientRect().right)}`);
return {width, scrollWidth: document.documentElement.scrollWidth, wide};
"""


def test_app_owner_sees_todays_spend_history_csv_and_signs_out(world, browser, tmp_path):
    browser.open(world.url("console"))
    form = browser.driver.find_element(By.ID, "sign-in-form")
    assert form.find_element(By.NAME, "client_id") and form.find_element(By.NAME, "client_secret")
    assert browser.js("return [...document.querySelectorAll('input')].every(i => i.labels.length > 0)")
    assert browser.js("return !!document.querySelector('[role=status][aria-live]')")
    browser.sign_in_with_keyboard(world.app_credentials)
    assert browser.state() == "ready"

    token_reply = browser.responses("/auth/token")
    assert [r["response"]["status"] for r in token_reply] == [200]
    page_tokens = json.loads(browser.body(token_reply[0]["id"]))
    secrets = [world.app_credentials["client_secret"], page_tokens["access_token"], page_tokens["refresh_token"]]

    # Today: the premium row shows exactly $1.12, and every row and the summary say what the API says.
    premium = browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-label="premium"]')
    assert premium.find_element(By.CSS_SELECTOR, ".spend").text == "$1.12"
    access = world.tokens(world.app_credentials)["access_token"]
    app_path = f"api/v1/orgs/{world.org_id}/apps/{APP_ID}"
    today = world.get(f"{app_path}/aggregates/today", access).json()
    selection = world.get(f"{app_path}/model-selection", access).json()
    shown = browser.label_rows()
    assert list(shown) == list(today["models"])
    for label, model in today["models"].items():
        assert shown[label] == {
            "label": label,
            "spend": dollars(model["cost_usd_micros"]),
            "quota": dollars(model["quota_usd_micros"]),
            "pct": f"{model['quota_pct']:.1f}%",
            "requests": str(model["requests"]),
            "status": model["quota_status"],
        }, label
    assert today["models"]["premium"]["cost_usd_micros"] == PREMIUM_MICROS
    assert shown["economy"]["status"] == "TIGHT" and shown["premium"]["requests"] == "2"
    assert browser.text("mode") == selection["quota_status"]["mode"] == "NORMAL"
    assert browser.text("active-model") == selection["recommended_model"]["label"] == "premium"
    assert browser.text("sticky").startswith("on" if selection["quota_status"]["sticky_fallback_active"] else "off")
    assert browser.text("total").startswith(dollars(today["total_cost_usd_micros"]))

    # History: an SVG chart in #history whose bars add up to the spend report's rows.
    assert browser.driver.find_elements(By.CSS_SELECTOR, "#history svg")
    day = today["date"]
    start = (datetime.strptime(day, "%Y-%m-%d") - timedelta(days=29)).strftime("%Y-%m-%d")
    rows = world.get(
        f"api/v1/orgs/{world.org_id}/reports/spend", access, **{"from": start, "to": day, "app_id": APP_ID}
    ).json()["rows"]
    bars = browser.js("""return [...document.querySelectorAll('#history svg rect')].map(
        r => [r.dataset.day, r.dataset.series, r.querySelector('title').textContent])""")
    assert sorted(bars) == sorted(
        [row["date"], row["label"], f"{row['date']} · {row['label']}: {dollars(row['cost_usd_micros'])}"]
        for row in rows
    )
    assert {row["label"] for row in rows} == {"premium", "standard", "economy"}

    # Alerts are the org's: an app token gets a note instead.
    assert "org token" in browser.text("alerts-note")
    assert not browser.js("return document.querySelectorAll('#alerts li').length")

    assert browser.errors() == []  # no CSP violation, no error
    browser.screenshot("console")

    # CSV: the download is the API's own CSV for the same range.
    browser.click("download-csv")
    name = f"spend-{world.org_id}-{start}-{day}.csv"
    downloaded = eventually(lambda: (tmp_path / name).is_file() and (tmp_path / name).read_bytes(), "the CSV download")
    expected = world.get(
        f"api/v1/orgs/{world.org_id}/reports/spend",
        access,
        **{"from": start, "to": day, "app_id": APP_ID, "format": "csv"},
    )
    assert downloaded == expected.content

    # A refused access token is renewed with the refresh token, and the reload still works.
    revoked = requests.post(
        world.url("auth/revoke"),
        timeout=10,
        headers={"Authorization": f"Bearer {page_tokens['access_token']}"},
        json={"token": page_tokens["access_token"], "token_type_hint": "access_token"},
    )
    assert revoked.status_code == 204
    browser.click("reload")
    browser.wait_ready()
    assert [r["response"]["status"] for r in browser.responses("/auth/refresh")] == [200]
    renewed = json.loads(browser.body(browser.responses("/auth/refresh")[0]["id"]))["access_token"]
    secrets.append(renewed)
    assert browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-label="premium"] .spend').text == "$1.12"

    assert_tokens_only_in_memory(browser, secrets)

    # Sign-out revokes the refresh token: the service refuses it afterwards.
    browser.click("sign-out")
    WebDriverWait(browser.driver, WAIT_SECONDS).until(lambda _: browser.responses("/auth/revoke"))
    assert [r["response"]["status"] for r in browser.responses("/auth/revoke")] == [204]
    assert browser.state() == "signed-out"
    assert "revoked" in browser.text("status")
    assert browser.driver.find_element(By.ID, "client_secret").get_attribute("value") == ""
    assert browser.driver.find_element(By.ID, "dashboard").get_attribute("hidden") is not None
    refused = requests.post(
        world.url("auth/refresh"),
        timeout=10,
        json={"refresh_token": page_tokens["refresh_token"], "grant_type": "refresh_token"},
    )
    assert refused.status_code == 401
    assert world.get(f"{app_path}/aggregates/today", renewed).status_code == 401

    assert_tokens_only_in_memory(browser, secrets)
    assert_only_local_requests(browser, world.base_url, secrets)


def test_operator_sees_apps_and_alerts_at_phone_width(world, browser):
    browser.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 375, "height": 812, "deviceScaleFactor": 2, "mobile": True}
    )
    browser.open(world.url("console"))
    assert browser.js("return window.innerWidth") == 375
    # A wrong secret is refused in the alert region, the field marked and focused for another try.
    browser.sign_in_with_keyboard({**world.org_credentials, "client_secret": "not-the-secret"})
    assert browser.state() == "signed-out" and browser.text("error") == "Wrong client ID or client secret."
    assert browser.focused() == "client_secret"
    assert browser.driver.find_element(By.ID, "client_secret").get_attribute("aria-invalid") == "true"
    browser.driver.find_element(By.ID, "client_secret").clear()
    browser.driver.find_element(By.ID, "client_id").clear()
    browser.driver.find_element(By.ID, "client_id").click()
    browser.sign_in_with_keyboard(world.org_credentials)
    assert browser.state() == "ready" and browser.text("error") == ""
    assert browser.text("who-text") == f"Organisation {world.org_id}"

    apps = browser.js("""return [...document.querySelectorAll('#apps tbody tr')].map(
        tr => [...tr.querySelectorAll('th, td')].slice(0, 4).map(c => c.textContent))""")
    assert apps == [[APP_ID, "$1.81", "$1.81", str(len(USAGE))]]
    alerts = browser.js("""return [...document.querySelectorAll('#alerts li')].map(li => li.textContent)""")
    assert len(alerts) == 2 and all(alert.startswith("THRESHOLD") for alert in alerts)
    assert any("premium reached 80% of its quota · app checkout" in alert for alert in alerts)
    assert any("economy reached 80% of its quota · app checkout" in alert for alert in alerts)
    assert browser.driver.find_elements(By.CSS_SELECTOR, "#history svg rect")

    layout = browser.js(OVERFLOW_SCRIPT)
    assert layout["scrollWidth"] <= layout["width"] == 375 and not layout["wide"], layout
    assert browser.js(CONTRAST_SCRIPT) == []
    browser.screenshot("console-phone")

    # The org opens its app: the app's own selection (mode, model) with the org token.
    open_app = browser.driver.find_element(By.CSS_SELECTOR, f'#apps button[data-app="{APP_ID}"]')
    open_app.send_keys(Keys.ENTER)
    browser.wait_ready()
    assert browser.driver.find_element(By.CSS_SELECTOR, 'tr[data-label="premium"] .spend').text == "$1.12"
    assert browser.text("active-model") == "premium"
    assert browser.js(OVERFLOW_SCRIPT)["wide"] == []

    attempts = browser.responses("/auth/token")
    assert [r["response"]["status"] for r in attempts] == [401, 200]
    org_tokens = json.loads(browser.body(attempts[1]["id"]))
    secrets = [world.org_credentials["client_secret"], org_tokens["access_token"], org_tokens["refresh_token"]]
    assert_tokens_only_in_memory(browser, secrets)
    assert_only_local_requests(browser, world.base_url, secrets)


RECONCILED_MODEL = "amazon.nova-2-lite-v1:0"
SETTLE_SECONDS = 60  # a deadline for the reconciler: the 5 s tolerance, then a run every second
EMPTY_DAY = "2020-01-02"  # before this server existed: never reconciled


def reconcile_in_page(browser: ConsoleBrowser, key: str, day: str) -> None:
    """Type ``key`` (if any) into the key field, set the day, press Enter, and wait for an answer."""
    field = browser.driver.find_element(By.ID, "provisioning_key")
    field.clear()
    if key:
        field.send_keys(key)
    browser.js("document.getElementById('recon_date').value = arguments[0]", day)
    browser.js("document.getElementById('recon-meta').textContent = ''")
    field.send_keys(Keys.ENTER)
    WebDriverWait(browser.driver, WAIT_SECONDS).until(
        lambda _: browser.text("recon-error") or browser.text("recon-meta") not in ("", "Loading…")
    )


def reconciliation_rows(browser: ConsoleBrowser) -> list[list[str]]:
    return browser.js("""return [...document.querySelectorAll('#reconciliation tbody tr')].map(
        tr => [tr.dataset.model, ...[...tr.querySelectorAll('th, td')].map(c => c.textContent)])""")


def test_operator_sees_the_reconciliation_with_the_provisioning_key(world, browser):
    browser.open(world.url("console"))
    today = datetime.now(UTC).date().isoformat()
    assert browser.js("return document.getElementById('recon_date').value") == today

    # A wrong key: the service's 401, in the alert region, the field marked; nothing shown.
    reconcile_in_page(browser, "not-the-key", today)
    assert browser.text("recon-error") == (
        "Wrong provisioning key. Could not load the reconciliation: "
        + requests.get(world.url("api/v1/reconciliation"), headers={"X-API-Key": "x"}, timeout=10).json()["message"]
        + " (UNAUTHORIZED, HTTP 401)"
    )
    assert browser.driver.find_element(By.ID, "provisioning_key").get_attribute("aria-invalid") == "true"
    assert browser.driver.find_element(By.ID, "recon-result").get_attribute("hidden") is not None
    assert [r["response"]["status"] for r in browser.responses("/api/v1/reconciliation")] == [401]

    # An empty day: an empty table and a clear message.
    reconcile_in_page(browser, KEY, EMPTY_DAY)
    assert browser.text("recon-error") == ""
    assert reconciliation_rows(browser) == []
    assert browser.text("recon-empty").startswith(f"Nothing reconciled for {EMPTY_DAY}")
    assert browser.text("recon-meta").startswith(f"{EMPTY_DAY} (UTC) in us-east-1 · 0 models")
    assert browser.driver.find_element(By.ID, "provisioning_key").get_attribute("value") == ""

    # Two calls Bedrock counted and nobody reported, once the reconciler (every second) saw them.
    runtime = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=world.base_url,
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    messages = [{"role": "user", "content": [{"text": "Was this call reported? " * 10}]}]
    for _ in range(2):
        runtime.converse(modelId=RECONCILED_MODEL, messages=messages, inferenceConfig={"maxTokens": 40})

    def counted():
        models = requests.get(
            world.url("api/v1/reconciliation"), params={"date": today}, headers={"X-API-Key": KEY}, timeout=10
        ).json()["models"]
        return any(m["model_id"] == RECONCILED_MODEL and m["bedrock"]["invocations"] >= 2 for m in models)

    eventually(counted, "the reconciler to count the two calls", seconds=SETTLE_SECONDS)
    reconcile_in_page(browser, "", today)  # the key the page holds
    assert browser.text("recon-error") == ""
    replies = browser.responses("/api/v1/reconciliation")
    assert [r["response"]["status"] for r in replies] == [401, 200, 200]
    shown = json.loads(browser.body(replies[-1]["id"]))
    assert shown["date"] == today and shown["models"]
    rows = reconciliation_rows(browser)
    assert rows == [
        [
            m["model_id"],
            m["model_id"],
            *(
                f"{n:,}"
                for n in (
                    m["bedrock"]["invocations"],
                    m["bedrock"]["input_tokens"],
                    m["bedrock"]["output_tokens"],
                    m["metered"]["invocations"],
                    m["metered"]["input_tokens"],
                    m["metered"]["output_tokens"],
                    m["unmetered"]["input_tokens"],
                    m["unmetered"]["output_tokens"],
                )
            ),
            dollars(m["unmetered"]["estimated_cost_usd_micros"])
            if m["unmetered"]["estimated_cost_usd_micros"] >= 5_000 or not m["unmetered"]["estimated_cost_usd_micros"]
            else "<$0.01",
        ]
        for m in shown["models"]
    ]
    lite = next(row for row in rows if row[0] == RECONCILED_MODEL)
    assert int(lite[2]) >= 2 and browser.text("recon-empty") == ""
    # No CSP violation, no script error: only the wrong key's refused request.
    assert [(e["source"], "status of 401" in e["message"]) for e in browser.errors()] == [("network", True)]
    browser.screenshot("console-reconciliation")
    assert browser.js(CONTRAST_SCRIPT) == []
    # At phone width the rows become cards: nothing overflows.
    browser.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 375, "height": 812, "deviceScaleFactor": 2, "mobile": True}
    )
    WebDriverWait(browser.driver, WAIT_SECONDS).until(lambda _: browser.js("return window.innerWidth") == 375)
    layout = browser.js(OVERFLOW_SCRIPT)
    assert layout["scrollWidth"] <= layout["width"] == 375 and not layout["wide"], layout
    browser.screenshot("console-reconciliation-phone")

    # Forgotten, the key is asked for again.
    browser.click("forget-key")
    reconcile_in_page(browser, "", today)
    assert browser.text("recon-error") == "Enter the provisioning key."
    assert len(browser.responses("/api/v1/reconciliation")) == 3

    assert_tokens_only_in_memory(browser, [KEY])
    assert_only_local_requests(browser, world.base_url, [KEY])
    headers = [r["headers"] for r in browser.requests_sent() if "/api/v1/reconciliation" in r["url"]]
    assert [h.get("X-API-Key") for h in headers] == ["not-the-key", KEY, KEY]
