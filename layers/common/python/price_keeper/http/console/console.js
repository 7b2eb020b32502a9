(() => {
  'use strict';

  // The API is beside the page: "/console" locally, "/{stage}/console" behind API Gateway.
  const API_ROOT = location.pathname.replace(/\/console\/?$/, '/');
  const CLIENT_ID = /^org-([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})(?:-app-([A-Za-z0-9][A-Za-z0-9._-]{0,63}))?$/;
  const REFRESH_MARGIN_SECONDS = 60; // refresh the access token this long before it expires
  const AUTO_RELOAD_MS = 60000; // totals are seconds fresh; a minute between reloads keeps the page calm
  const HISTORY_DAYS = 30;
  // Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
  const COLOURS = ['#0072b2', '#d55e00', '#009e73', '#cc79a7', '#e69f00', '#56b4e9', '#6a3d9a', '#1b1f24'];
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const USD = new Intl.NumberFormat('en-US', { style: 'currency', currency: 'USD' });
  const INT = new Intl.NumberFormat('en-US');

  const $ = (id) => document.getElementById(id);
  const main = $('main');

  // Tokens live in this closure only: never in storage, cookies or URLs.
  let session = null; // {orgId, appId, access, refresh, timer, refreshing}
  let viewApp = null; // the app shown: the token's own, or one an org token opened
  let labelOrder = [];
  let report = null; // {query, from, to} of the history shown (for the CSV)
  let drawn = null; // {rows, from, to} of the chart, to redraw it at a new width
  let drawnWidth = 0;
  let loading = null;
  let autoReload = null;
  let operatorKey = null; // the provisioning key, in this closure only (like the tokens)

  class SessionEnded extends Error {}
  class ApiProblem extends Error {
    constructor(reply, what) { super(`Could not load ${what}: ${errorText(reply)}`); }
  }

  // --- small helpers ---------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    node.append(...children.map((c) => (c instanceof Node ? c : String(c))));
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    node.append(...children.map((c) => (c instanceof Node ? c : String(c))));
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }

  function money(micros) {
    if (micros === null || micros === undefined) return '–';
    if (micros > 0 && micros < 5000) return '<$0.01';
    return USD.format(Math.round(micros / 10000) / 100); // cents rounded half up, in integers
  }

  const exact = (micros) => `${INT.format(micros)} micro-USD`;
  const percent = (pct) => (typeof pct === 'number' ? `${pct.toFixed(1)}%` : '–');
  const enc = encodeURIComponent;

  function addDays(isoDay, days) {
    const [y, m, d] = isoDay.split('-').map(Number);
    return new Date(Date.UTC(y, m - 1, d + days)).toISOString().slice(0, 10);
  }

  function localTime(iso) {
    const when = new Date(iso);
    return Number.isNaN(when.getTime()) ? String(iso) : when.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  }

  function errorText(reply) {
    const body = reply && reply.data;
    if (body && typeof body === 'object' && body.message) return `${body.message} (${body.error}, HTTP ${reply.status})`;
    return `HTTP ${reply ? reply.status : '?'}`;
  }

  function announce(text) { $('status').textContent = text; }
  function showError(text) { $('error').textContent = text; }
  function clearError() { $('error').textContent = ''; }

  function badge(status) { return el('span', { class: `badge ${status}` }, status); }

  // --- the API -----------------------------------------------------------------------

  async function call(path, {
    method = 'GET', body = null, auth = true, retry = true, accept = 'application/json', apiKey = null,
  } = {}) {
    const s = session;
    if (auth && !s) throw new SessionEnded('signed out');
    const headers = { Accept: accept };
    if (apiKey !== null) headers['X-API-Key'] = apiKey;
    if (body !== null) headers['Content-Type'] = 'application/json';
    if (auth) headers.Authorization = `Bearer ${s.access}`;
    const response = await fetch(API_ROOT + path, {
      method, headers, body: body === null ? null : JSON.stringify(body),
      cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
    });
    if (response.status === 401 && auth && retry) {
      if (s === session && await refreshAccess(s)) return call(path, { method, body, auth, retry: false, accept });
      if (s === session) endSession('Your session has ended. Sign in again.');
      throw new SessionEnded('session ended');
    }
    const type = response.headers.get('Content-Type') || '';
    const data = type.includes('json') ? await response.json().catch(() => null) : await response.text();
    return { status: response.status, ok: response.ok, data, headers: response.headers };
  }

  function refreshAccess(s) {
    if (!s.refreshing) {
      s.refreshing = (async () => {
        try {
          const reply = await call('auth/refresh', {
            method: 'POST', auth: false, body: { refresh_token: s.refresh, grant_type: 'refresh_token' },
          });
          if (reply.status !== 200 || s !== session) return false;
          s.access = reply.data.access_token;
          scheduleRefresh(s, reply.data.expires_in);
          return true;
        } catch (error) {
          return false;
        } finally {
          s.refreshing = null;
        }
      })();
    }
    return s.refreshing;
  }

  function scheduleRefresh(s, expiresIn) {
    clearTimeout(s.timer);
    const seconds = Math.max(5, (Number(expiresIn) || 3600) - REFRESH_MARGIN_SECONDS);
    s.timer = setTimeout(async () => {
      if (s === session && !(await refreshAccess(s)) && s === session) {
        endSession('Your session has expired. Sign in again.');
      }
    }, seconds * 1000);
  }

  // --- signing in and out ---------------------------------------------------------------

  function setInvalid(input, invalid) {
    if (invalid) input.setAttribute('aria-invalid', 'true'); else input.removeAttribute('aria-invalid');
  }

  async function signIn(event) {
    event.preventDefault();
    const idInput = $('client_id');
    const secretInput = $('client_secret');
    const button = $('sign-in-button');
    const clientId = idInput.value.trim();
    const secret = secretInput.value;
    clearError();
    const match = CLIENT_ID.exec(clientId);
    setInvalid(idInput, !match);
    setInvalid(secretInput, !secret);
    if (!match) {
      showError('The client ID must look like org-{uuid} (an organisation) or org-{uuid}-app-{app_id} (an app).');
      idInput.focus();
      return;
    }
    if (!secret) {
      showError('Enter the client secret.');
      secretInput.focus();
      return;
    }
    button.disabled = true;
    announce('Signing in…');
    let reply;
    try {
      reply = await call('auth/token', {
        method: 'POST', auth: false,
        body: { client_id: clientId, client_secret: secret, grant_type: 'client_credentials' },
      });
    } catch (error) {
      reply = null;
    } finally {
      button.disabled = false;
    }
    if (!reply || reply.status !== 200) {
      announce('');
      showError(!reply ? 'Could not reach the service.'
        : reply.status === 401 ? 'Wrong client ID or client secret.' : `Sign-in failed: ${errorText(reply)}`);
      setInvalid(secretInput, Boolean(reply && reply.status === 401));
      secretInput.focus();
      return;
    }
    secretInput.value = '';
    session = { orgId: match[1], appId: match[2] || null, access: reply.data.access_token,
      refresh: reply.data.refresh_token, timer: null, refreshing: null };
    scheduleRefresh(session, reply.data.expires_in);
    viewApp = session.appId;
    $('who-text').textContent = session.appId
      ? `App ${session.appId} · organisation ${session.orgId}` : `Organisation ${session.orgId}`;
    $('who').hidden = false;
    $('sign-in').hidden = true;
    $('dashboard').hidden = false;
    $('back-to-org').hidden = true;
    $('today-title').focus();
    autoReload = setInterval(() => { if (document.visibilityState === 'visible') load(); }, AUTO_RELOAD_MS);
    await load();
  }

  function clearSession() {
    if (session) clearTimeout(session.timer);
    clearInterval(autoReload);
    session = null;
    viewApp = null;
    report = null;
    drawn = null;
    for (const id of ['labels', 'apps', 'history-table']) $(id).tBodies[0].replaceChildren();
    for (const id of ['history', 'legend', 'alerts']) $(id).replaceChildren();
    for (const id of ['mode', 'active-model', 'sticky', 'total']) $(id).textContent = '–';
  }

  function showSignedOut() {
    $('dashboard').hidden = true;
    $('who').hidden = true;
    $('sign-in').hidden = false;
    main.dataset.state = 'signed-out';
    $('client_id').focus();
  }

  function endSession(message) {
    clearSession();
    showSignedOut();
    announce('');
    showError(message);
  }

  async function signOut() {
    const s = session;
    if (!s) return;
    const button = $('sign-out');
    button.disabled = true;
    let revoked = false;
    try {
      const reply = await call('auth/revoke', {
        method: 'POST', body: { token: s.refresh, token_type_hint: 'refresh_token' },
      });
      revoked = reply.status === 204;
    } catch (error) {
      revoked = error instanceof SessionEnded; // its tokens were refused already
    } finally {
      button.disabled = false;
    }
    if (session === s) clearSession();
    showSignedOut();
    clearError();
    announce(revoked ? 'Signed out; the session’s tokens are revoked.'
      : 'Signed out of this page, but the service did not confirm revoking the tokens.');
  }

  // --- loading the dashboard -----------------------------------------------------------

  function setBusy(busy) {
    $('dashboard').setAttribute('aria-busy', busy ? 'true' : 'false');
    $('reload').disabled = busy;
    if (busy) main.dataset.state = 'loading';
  }

  function load() {
    const s = session;
    if (!s) return Promise.resolve();
    if (loading) return loading;
    loading = (async () => {
      setBusy(true);
      announce('Loading…');
      try {
        await loadInto(s);
        if (s === session) {
          clearError();
          main.dataset.state = 'ready';
          announce(`Updated at ${new Date().toLocaleTimeString()}.`);
        }
      } catch (error) {
        if (s === session && !(error instanceof SessionEnded)) {
          main.dataset.state = 'error';
          announce('');
          showError(error instanceof ApiProblem ? error.message
            : 'Could not reach the service. Check the connection and press Refresh.');
        }
      } finally {
        setBusy(false);
        loading = null;
      }
    })();
    return loading;
  }

  async function loadInto(s) {
    const org = `api/v1/orgs/${enc(s.orgId)}`;
    const app = viewApp;
    const scope = app ? `${org}/apps/${enc(app)}` : org;
    const [today, selection] = await Promise.all([
      call(`${scope}/aggregates/today`),
      app ? call(`${scope}/model-selection`) : Promise.resolve(null),
    ]);
    if (s !== session) return;
    if (!today.ok) throw new ApiProblem(today, 'today’s spend');
    renderToday(today.data, selection);

    const to = today.data.date;
    const from = addDays(to, -(HISTORY_DAYS - 1));
    const query = new URLSearchParams({ from, to });
    if (s.appId) query.set('app_id', s.appId); // an app token may read its own rows only
    const [spend, alerts] = await Promise.all([
      call(`${org}/reports/spend?${query}`),
      s.appId ? Promise.resolve(null) : call(`${org}/alerts?date=${enc(to)}`),
    ]);
    if (s !== session) return;
    if (!spend.ok) throw new ApiProblem(spend, 'the spend report');
    const rows = spend.data.rows;
    const shown = app ? rows.filter((row) => row.app_id === app || row.app_id === null) : rows;
    if (app) query.set('app_id', app);
    report = { query: query.toString(), from, to };
    renderHistory(shown, from, to);

    $('apps-section').hidden = Boolean(s.appId);
    if (!s.appId) renderApps(rows, to);

    if (s.appId) {
      $('alerts').replaceChildren();
      $('alerts-note').textContent = 'Alerts are listed with the organisation’s credentials (the API shows them to an org token only).';
      $('alerts-note').hidden = false;
    } else {
      if (!alerts.ok) throw new ApiProblem(alerts, 'today’s alerts');
      renderAlerts(alerts.data.alerts.filter((alert) => !app || alert.app_id === app || alert.app_id === null));
    }
  }

  // --- today -------------------------------------------------------------------------

  function usedBar(pct, status) {
    const fill = el('span');
    fill.style.width = `${Math.min(100, Math.max(0, Number(pct) || 0))}%`; // CSSOM: allowed by the CSP
    return el('div', { class: 'used' },
      el('div', { class: `bar ${status}`, 'aria-hidden': 'true' }, fill),
      el('span', { class: 'pct' }, percent(pct)));
  }

  function renderToday(data, selection) {
    const models = Object.values(data.models || {});
    labelOrder = models.map((m) => m.label);
    $('today-title').textContent = viewApp ? `Today · app ${viewApp}` : 'Today · whole organisation';
    $('back-to-org').hidden = !(session && !session.appId && viewApp);
    const updated = data.updated_at ? `aggregated at ${localTime(data.updated_at)}` : 'nothing aggregated yet today';
    $('today-meta').textContent = `${data.date} in ${data.timezone} · quota scope ${data.quota_scope} · ${updated}`
      + ' (totals lag usage by a second or two)';
    $('labels').tBodies[0].replaceChildren(...models.map((m) => el('tr', { 'data-label': m.label },
      el('th', { scope: 'row', 'data-th': 'Label' }, m.label),
      el('td', { class: 'num spend', 'data-th': 'Spend', title: exact(m.cost_usd_micros) }, money(m.cost_usd_micros)),
      el('td', { class: 'num quota', 'data-th': 'Quota', title: exact(m.quota_usd_micros) }, money(m.quota_usd_micros)),
      el('td', { class: 'used-cell', 'data-th': 'Used' }, usedBar(m.quota_pct, m.quota_status)),
      el('td', { class: 'num requests', 'data-th': 'Requests' }, INT.format(m.requests)),
      el('td', { class: 'quota-status', 'data-th': 'Status' }, badge(m.quota_status)))));

    $('total').textContent = `${money(data.total_cost_usd_micros)} of ${money(data.total_quota_usd_micros)}`
      + ` (${percent(data.total_quota_pct)})`;
    let mode;
    let active;
    let sticky = data.sticky_fallback_active;
    let note = '';
    if (selection && selection.status === 200) {
      const status = selection.data.quota_status;
      mode = status.mode;
      active = selection.data.recommended_model.label;
      sticky = status.sticky_fallback_active;
    } else if (selection && selection.status === 429 && selection.data && selection.data.error === 'QUOTA_EXCEEDED') {
      mode = 'EXCEEDED';
      active = null;
      note = `Every quota of today is spent: model selection answers 429 until ${localTime(selection.data.retry_after)}`
        + ` (${selection.data.retry_after}).`;
    } else if (selection) {
      mode = null;
      active = data.current_active_model;
      note = `Model selection did not answer: ${errorText(selection)}.`;
    } else {
      // An organisation: the label its own ordering would pick, and that label's state
      // (model selection's mode is TIGHT exactly when the chosen label is TIGHT).
      active = data.current_active_model;
      mode = !active ? 'EXCEEDED' : (data.models[active] && data.models[active].quota_status === 'TIGHT' ? 'TIGHT' : 'NORMAL');
      if (data.quota_scope === 'APP') note = 'Quotas are per app: each app picks its model by its own ordering (open an app below).';
    }
    $('mode').replaceChildren(mode ? badge(mode) : '–');
    $('active-model').textContent = active || 'none (all spent)';
    $('sticky').textContent = sticky ? 'on (staying on a fallback today)' : 'off';
    $('selection-note').textContent = note;
    $('selection-note').hidden = !note;
  }

  // --- apps (org token) ---------------------------------------------------------------

  function renderApps(rows, today) {
    const apps = new Map();
    for (const row of rows) {
      const app = apps.get(row.app_id) || { id: row.app_id, today: 0, month: 0, requests: 0 };
      app.month += row.cost_usd_micros;
      if (row.date === today) {
        app.today += row.cost_usd_micros;
        app.requests += row.requests;
      }
      apps.set(row.app_id, app);
    }
    const list = [...apps.values()].sort((a, b) => String(a.id ?? '').localeCompare(String(b.id ?? '')));
    $('apps').tBodies[0].replaceChildren(...list.map((app) => {
      const action = app.id === null || app.id === viewApp ? ''
        : el('button', { type: 'button', class: 'link', 'data-app': app.id, 'aria-label': `Open app ${app.id}` }, 'Open');
      return el('tr', { 'data-app-row': app.id ?? '' },
        el('th', { scope: 'row', 'data-th': 'App' }, app.id ?? 'whole organisation (ORG quota scope)'),
        el('td', { class: 'num', 'data-th': 'Today', title: exact(app.today) }, money(app.today)),
        el('td', { class: 'num', 'data-th': 'Last 30 days', title: exact(app.month) }, money(app.month)),
        el('td', { class: 'num', 'data-th': 'Requests today' }, INT.format(app.requests)),
        el('td', { 'data-th': '' }, action));
    }));
    $('apps-empty').hidden = list.length > 0;
  }

  function openApp(appId) {
    viewApp = appId;
    $('today-title').focus();
    load();
  }

  // --- history -----------------------------------------------------------------------

  function niceCeiling(value) {
    if (value <= 0) return 1000000;
    const step = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 4, 5, 10].map((m) => m * step).find((candidate) => candidate >= value);
  }

  function renderHistory(rows, from, to) {
    drawn = { rows, from, to };
    const days = Array.from({ length: HISTORY_DAYS }, (_, i) => addDays(from, i));
    const labels = [...labelOrder];
    for (const row of rows) if (!labels.includes(row.label)) labels.push(row.label);
    const colour = (label) => COLOURS[labels.indexOf(label) % COLOURS.length];
    const perDay = new Map(days.map((day) => [day, new Map()]));
    const requests = new Map();
    for (const row of rows) {
      const day = perDay.get(row.date);
      if (!day) continue;
      day.set(row.label, (day.get(row.label) || 0) + row.cost_usd_micros);
      const key = `${row.date}|${row.label}`;
      requests.set(key, (requests.get(key) || 0) + row.requests);
    }
    const totals = days.map((day) => [...perDay.get(day).values()].reduce((a, b) => a + b, 0));
    const sum = totals.reduce((a, b) => a + b, 0);
    const highest = Math.max(...totals);
    const top = niceCeiling(highest);

    // Drawn in CSS pixels of its box (text stays legible on a phone); redrawn on resize.
    const W = Math.max(300, Math.round($('history').clientWidth) || 720);
    const H = W < 500 ? 200 : 240; const L = 56; const R = 8; const T = 12; const B = 28;
    const plotW = W - L - R; const plotH = H - T - B;
    const band = plotW / HISTORY_DAYS;
    const tick = (v) => `$${(v / 1e6).toFixed(top >= 40000 ? 2 : 4)}`;
    const chart = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', focusable: 'false',
      'aria-labelledby': 'history-svg-title history-svg-desc' },
    svg('title', { id: 'history-svg-title' }, `Spend per day from ${from} to ${to}`),
    svg('desc', { id: 'history-svg-desc' }, sum
      ? `Total ${money(sum)}; highest day ${days[totals.indexOf(highest)]} with ${money(highest)}.`
      : 'No spend in these 30 days.'));
    for (let i = 0; i <= 4; i += 1) {
      const y = T + plotH - (plotH * i) / 4;
      chart.append(svg('line', { class: i ? 'grid' : 'axis', x1: L, x2: W - R, y1: y, y2: y }),
        svg('text', { x: L - 6, y: y + 4, 'text-anchor': 'end' }, tick((top * i) / 4)));
    }
    days.forEach((day, i) => {
      const x = L + i * band;
      if ((HISTORY_DAYS - 1 - i) % 7 === 0) { // today, and every week before it
        const last = i === HISTORY_DAYS - 1;
        chart.append(svg('text', { x: last ? x + band : x + band / 2, y: H - 8, 'text-anchor': last ? 'end' : 'middle' },
          day.slice(5)));
      }
      let y = T + plotH;
      for (const label of labels) {
        const value = perDay.get(day).get(label) || 0;
        if (value <= 0) continue;
        const h = Math.max(1, (value / top) * plotH);
        y -= h;
        chart.append(svg('rect', { x: (x + band * 0.14).toFixed(2), y: y.toFixed(2), width: (band * 0.72).toFixed(2),
          height: h.toFixed(2), fill: colour(label), 'data-day': day, 'data-series': label },
        svg('title', {}, `${day} · ${label}: ${money(value)}`)));
      }
    });
    if (!sum) {
      chart.append(svg('text', { class: 'empty', x: L + plotW / 2, y: T + plotH / 2, 'text-anchor': 'middle' },
        'No spend in these 30 days'));
    }
    $('history').replaceChildren(chart);
    drawnWidth = W;
    $('history-meta').textContent = `${from} to ${to} (org-local days) · total ${money(sum)}`;

    const used = labels.filter((label) => rows.some((row) => row.label === label));
    $('legend').replaceChildren(...used.map((label) => {
      const swatch = el('span', { class: 'swatch', 'aria-hidden': 'true' });
      swatch.style.background = colour(label);
      return el('li', {}, swatch, label);
    }));
    const tableRows = [];
    for (const day of [...days].reverse()) {
      for (const label of labels) {
        const value = perDay.get(day).get(label);
        if (value === undefined) continue;
        tableRows.push(el('tr', {},
          el('td', { 'data-th': 'Day' }, day),
          el('td', { 'data-th': 'Label' }, label),
          el('td', { class: 'num', 'data-th': 'Spend', title: exact(value) }, money(value)),
          el('td', { class: 'num', 'data-th': 'Requests' }, INT.format(requests.get(`${day}|${label}`) || 0))));
      }
    }
    $('history-table').tBodies[0].replaceChildren(...tableRows);
  }

  async function downloadCsv() {
    const s = session;
    if (!s || !report) return;
    const button = $('download-csv');
    button.disabled = true;
    announce('Preparing the CSV…');
    try {
      const reply = await call(`api/v1/orgs/${enc(s.orgId)}/reports/spend?${report.query}&format=csv`, { accept: 'text/csv' });
      if (!reply.ok) throw new ApiProblem(reply, 'the CSV');
      const named = /filename="([^"]+)"/.exec(reply.headers.get('Content-Disposition') || '');
      const name = named ? named[1] : `spend-${s.orgId}-${report.from}-${report.to}.csv`;
      const url = URL.createObjectURL(new Blob([reply.data], { type: 'text/csv' }));
      const link = el('a', { href: url, download: name, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      announce(`Downloaded ${name}.`);
    } catch (error) {
      if (!(error instanceof SessionEnded)) {
        announce('');
        showError(error instanceof ApiProblem ? error.message : 'Could not reach the service.');
      }
    } finally {
      button.disabled = false;
    }
  }

  // --- alerts ------------------------------------------------------------------------

  function describe(alert) {
    const where = alert.app_id ? `app ${alert.app_id}` : 'organisation';
    if (alert.type === 'THRESHOLD') return `${alert.label} reached ${alert.threshold_pct}% of its quota · ${where}`;
    if (alert.type === 'FALLBACK') return `moved off ${alert.label} to the next label · ${where}`;
    if (alert.type === 'ALL_EXHAUSTED') return `every label is spent · ${where}`;
    return `${alert.label || ''} · ${where}`;
  }

  function renderAlerts(alerts) {
    $('alerts').replaceChildren(...alerts.map((alert) => el('li', { class: alert.type, 'data-type': alert.type },
      el('strong', {}, alert.type), ' ', describe(alert), ' ',
      el('span', { class: 'when' }, `· ${localTime(alert.fired_at)}`))));
    $('alerts-note').textContent = 'No alert has fired today.';
    $('alerts-note').hidden = alerts.length > 0;
  }

  // --- operator: reconciliation (provisioning key) -------------------------------------

  async function reconcile(event) {
    event.preventDefault();
    const keyInput = $('provisioning_key');
    const dateInput = $('recon_date');
    const button = $('reconcile-button');
    const key = keyInput.value || operatorKey;
    const day = dateInput.value;
    $('recon-error').textContent = '';
    setInvalid(keyInput, !key);
    setInvalid(dateInput, !/^\d{4}-\d{2}-\d{2}$/.test(day));
    if (!key) {
      $('recon-error').textContent = 'Enter the provisioning key.';
      keyInput.focus();
      return;
    }
    if (dateInput.getAttribute('aria-invalid')) {
      $('recon-error').textContent = 'Enter the day as YYYY-MM-DD.';
      dateInput.focus();
      return;
    }
    button.disabled = true;
    $('recon-meta').textContent = 'Loading…';
    let reply;
    let models = [];
    try {
      // a page of 500 models at a time (a fleet's application profiles are thousands a day)
      for (let page = 0; ; page += 1) {
        reply = await call(`api/v1/reconciliation?date=${enc(day)}&page=${page}`, { auth: false, apiKey: key });
        if (!reply.ok) break;
        models = models.concat(reply.data.models);
        if (page + 1 >= reply.data.pages) break;
      }
    } catch (error) {
      reply = null;
    } finally {
      button.disabled = false;
    }
    if (!reply || !reply.ok) {
      if (reply && reply.status === 401) forgetKey();
      setInvalid(keyInput, Boolean(reply && reply.status === 401));
      $('recon-meta').textContent = '';
      $('recon-result').hidden = true;
      $('recon-error').textContent = !reply ? 'Could not reach the service.'
        : `${reply.status === 401 ? 'Wrong provisioning key. ' : ''}${new ApiProblem(reply, 'the reconciliation').message}`;
      return;
    }
    operatorKey = key;
    keyInput.value = '';
    $('forget-key').hidden = false;
    renderReconciliation({ ...reply.data, models });
  }

  function forgetKey() {
    operatorKey = null;
    $('forget-key').hidden = true;
  }

  function renderReconciliation(data) {
    const count = (th, n) => el('td', { class: 'num', 'data-th': th }, INT.format(n));
    $('reconciliation').tBodies[0].replaceChildren(...data.models.map((m) => el('tr', { 'data-model': m.model_id },
      el('th', { scope: 'row', 'data-th': 'Model' }, m.model_id),
      count('Bedrock calls', m.bedrock.invocations),
      count('Bedrock input', m.bedrock.input_tokens),
      count('Bedrock output', m.bedrock.output_tokens),
      count('Metered calls', m.metered.invocations),
      count('Metered input', m.metered.input_tokens),
      count('Metered output', m.metered.output_tokens),
      count('Unmetered input', m.unmetered.input_tokens),
      count('Unmetered output', m.unmetered.output_tokens),
      el('td', { class: 'num cost', 'data-th': 'Unmetered cost', title: exact(m.unmetered.estimated_cost_usd_micros) },
        money(m.unmetered.estimated_cost_usd_micros)))));
    const unmetered = data.models.reduce((sum, m) => sum + m.unmetered.estimated_cost_usd_micros, 0);
    $('recon-meta').textContent = `${data.date} (UTC) in ${data.region} · ${data.models.length} model${data.models.length === 1 ? '' : 's'}`
      + ` · unmetered ${money(unmetered)}`;
    $('recon-empty').textContent = data.models.length ? ''
      : `Nothing reconciled for ${data.date}: Bedrock counted no call and nothing was metered, or the reconciler has not run for that day yet.`;
    $('recon-empty').hidden = data.models.length > 0;
    $('reconciliation').hidden = data.models.length === 0;
    $('recon-result').hidden = false;
  }

  // --- wiring ------------------------------------------------------------------------

  $('sign-in-form').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', signOut);
  $('reconciliation-form').addEventListener('submit', reconcile);
  $('forget-key').addEventListener('click', () => {
    forgetKey();
    $('provisioning_key').focus();
  });
  $('recon_date').value = new Date().toISOString().slice(0, 10);
  $('reload').addEventListener('click', () => load());
  $('download-csv').addEventListener('click', downloadCsv);
  $('back-to-org').addEventListener('click', () => openApp(null));
  $('apps').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-app]');
    if (button) openApp(button.dataset.app);
  });
  let resizing = null;
  window.addEventListener('resize', () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      const width = Math.max(300, Math.round($('history').clientWidth));
      if (drawn && session && width !== drawnWidth) renderHistory(drawn.rows, drawn.from, drawn.to);
    }, 150);
  });
  $('client_id').focus();
})();
