// troupe's dashboard: a card per model, live from /models/sse and /models, a log tail per
// model from /logs/stream, two charts from /metrics (seeded with the server's recent
// samples, /troupe/history, so a reload keeps them), and the recent requests
// (/troupe/requests). The memory chart plots what each model's child holds (its RSS, its
// GPU memory), not the whole machine's. A model filter narrows cards, series and
// requests to one model. Plain script, no build step.
//
// Every data route may need the API key, and a browser's EventSource cannot send an
// Authorization header, so streams are read with fetch() and the key (asked for once,
// kept in sessionStorage) goes with every request.
"use strict";
(() => {
  const BASE = location.pathname.replace(/\/troupe(\/.*)?$/, ""); // the --api-prefix, if any
  const KEY_STORE = "troupe-api-key";
  const LOG_LINES = 200; // kept per model in the page
  const CHART_POINTS = 150; // 5 minutes at one sample every 2 s
  const METRICS_EVERY = 2000;
  const MODELS_EVERY = 3000; // in-flight counts change without an event
  const ACTIVITY_ROWS = 25; // recent requests shown
  const GIB = 1024 ** 3;
  const MIB = 1024 ** 2;

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  let session = null; // the AbortController of the running streams and polls
  const cards = new Map(); // model -> {root, fields}
  const live = new Map(); // model -> {streams, tps}: its streams now (GET /metrics)
  const lastSpeed = new Map(); // model -> tokens/s of its last request that ended
  const kvCounts = new Map(); // model -> {restored, saved}: the KV store's counters
  // The model the page is narrowed to ("" = all), kept in the address (#model=NAME).
  let filter = new URLSearchParams(location.hash.slice(1)).get("model") || "";
  const logs = new Map(); // model -> {lines: [], lastSeq}
  const $ = (id) => document.getElementById(id);

  class NeedKey extends Error {}

  // In a cluster (--cluster-nodes) /models lists every node's models; the dashboard is
  // this node's, so it asks for this node's own list.
  const OWN_MODELS = { headers: { "x-troupe-forwarded": "dashboard" } };

  // ----- HTTP ------------------------------------------------------------------------

  async function api(path, options = {}) {
    const headers = Object.assign({}, options.headers || {});
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    const resp = await fetch(BASE + path, Object.assign({}, options, { headers }));
    if (resp.status === 401) throw new NeedKey("the API key was refused");
    return resp;
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      return (body.error && body.error.message) || "HTTP " + resp.status;
    } catch (_) {
      return "HTTP " + resp.status;
    }
  }

  // Server-sent events through fetch: calls onEvent(name, data) for each event.
  async function readEvents(path, onEvent, onOpen, signal) {
    const resp = await api(path, { signal, headers: { Accept: "text/event-stream" } });
    if (!resp.ok) throw new Error(path + ": " + (await errorText(resp)));
    onOpen();
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          else if (line.startsWith("event:")) name = line.slice(6).trim();
        }
        if (data.length) onEvent(name, data.join("\n"));
      }
    }
  }

  // Keep a stream open: reconnect a second after it ends or fails.
  async function follow(path, onEvent, onOpen, signal) {
    while (!signal.aborted) {
      try {
        await readEvents(path, onEvent, onOpen, signal);
      } catch (err) {
        if (err instanceof NeedKey) return askForKey(err.message);
      }
      if (signal.aborted) return;
      setConnection("retrying");
      await sleep(1000);
    }
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // ----- the key -----------------------------------------------------------------------

  function askForKey(message) {
    if (session) session.abort();
    session = null;
    setConnection("key");
    $("key-form").hidden = false;
    $("key-error").textContent = apiKey ? message : "";
    $("key-input").focus();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $("key-input").value.trim();
    sessionStorage.setItem(KEY_STORE, apiKey);
    $("key-form").hidden = true;
    start();
  });

  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    location.reload();
  });

  function setConnection(state) {
    const el = $("connection");
    el.dataset.state = state;
    el.textContent = { live: "live", connecting: "connecting", retrying: "reconnecting",
                       key: "API key needed" }[state];
  }

  function showError(message) {
    $("error").hidden = !message;
    $("error").textContent = message || "";
  }

  // ----- model cards -------------------------------------------------------------------

  function bytesText(n) {
    return n >= GIB ? (n / GIB).toFixed(2) + " GiB" : (n / 2 ** 20).toFixed(1) + " MiB";
  }

  function bytes(perDevice) {
    if (!perDevice) return "-";
    const size = (n) => n >= GIB ? (n / GIB).toFixed(2) + " GiB" : (n / 2 ** 20).toFixed(1) + " MiB";
    const parts = Object.entries(perDevice).map(([dev, n]) => `${dev} ${size(n)}`);
    return parts.length ? parts.join(", ") : "-";
  }

  function card(model) {
    let found = cards.get(model);
    if (found) return found;
    const root = $("card-template").content.firstElementChild.cloneNode(true);
    root.dataset.model = model;
    const field = (cls) => root.querySelector("." + cls);
    found = { root, field };
    field("name").textContent = model;
    field("load").addEventListener("click", () => act("/models/load", model, found));
    field("unload").addEventListener("click", () => act("/models/unload", model, found));
    cards.set(model, found);
    $("models").appendChild(root);
    renderLog(model);
    return found;
  }

  function setStatus(c, status) {
    const el = c.field("status");
    el.textContent = status;
    el.dataset.status = status;
    c.root.dataset.status = status;
    const running = ["loading", "loaded", "sleeping"].includes(status);
    c.field("load").disabled = running;
    c.field("unload").disabled = !running;
    if (status !== "loading") c.field("progress").hidden = true;
    if (!running) c.field("memory-used").textContent = "-"; // the child is gone
  }

  async function act(path, model, c) {
    c.field("action-error").textContent = "";
    try {
      const resp = await api(path, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model }),
      });
      if (!resp.ok) c.field("action-error").textContent = await errorText(resp);
    } catch (err) {
      if (err instanceof NeedKey) return askForKey(err.message);
      c.field("action-error").textContent = String(err);
    }
    refreshSoon();
  }

  // Where its child runs: "CPUs 0-3, 4 threads" (troupe's lane) or what its flags say.
  function cpuText(cpu) {
    if (!cpu) return "-";
    const threads = cpu.threads == null ? "" : `, ${cpu.threads} thread${cpu.threads === 1 ? "" : "s"}`;
    const where = cpu.cpus ? `CPUs ${cpu.cpus}` : "any CPUs";
    const how = cpu.placed_by === "flags" ? " (its own flags)" : cpu.shared ? " (shared)" : "";
    return where + threads + how;
  }

  // The GPUs its child runs on (docs/gpus.md): "CUDA 0, 2 (split 40000:20000)"; "-" without.
  function gpuText(gpu) {
    if (!gpu) return "-";
    if (!gpu.devices) return "every GPU (its own flags)";
    if (!gpu.devices.length) return "none";
    const cards = gpu.devices.join(", ");
    const split = gpu.tensor_split ? ` (split ${gpu.tensor_split.join(":")})` : "";
    const layers = gpu.gpu_layers == null ? "" : `, ${gpu.gpu_layers} layers`;
    const how = gpu.placed_by === "flags" ? " (its own flags)" : "";
    return cards + split + layers + how;
  }

  function renderModels(items) {
    const seen = new Set();
    for (const item of items) {
      seen.add(item.id);
      const c = card(item.id);
      const extra = item.troupe || {};
      setStatus(c, item.status.value);
      c.root.dataset.failed = String(Boolean(item.status.failed));
      // Its child, as troupe ps shows it: pid and port, how long it has been up.
      c.field("process").textContent = extra.pid ? `pid ${extra.pid}, port ${extra.port}` : "-";
      c.field("up").textContent = extra.up_seconds == null ? "-" : duration(extra.up_seconds);
      c.field("in-flight").textContent = extra.in_flight ?? 0;
      const position = extra.queue_position ? ` (queue position ${extra.queue_position})` : "";
      const why = extra.wait_reason ? `: ${extra.wait_reason}` : "";
      c.field("waiting").textContent = (extra.waiting ?? 0) + position + why;
      // The context its child starts with and its need: troupe doctor's and troupe models' figures.
      const context = extra.context;
      c.field("context").textContent = context ? `${context.n_ctx} (${context.why})` : "-";
      const memory = extra.memory || {};
      const source = memory.source ? ` (${memory.source})` : "";
      c.field("memory-need").textContent = bytes(memory.need_bytes) + (memory.need_bytes ? source : "");
      const running = ["loading", "loaded", "sleeping"].includes(item.status.value);
      c.field("memory-used").textContent = running ? bytes(memory.used_bytes) : "-";
      c.field("cpu").textContent = cpuText(extra.cpu);
      const gpuField = c.field("gpu");
      if (gpuField) gpuField.textContent = gpuText(extra.gpu);
      c.kv = extra.kv || null; // absent with --kv-store off
      renderLive(item.id, c);
      const load = extra.last_load_seconds;
      c.field("last-load").textContent = load == null ? "-" : load.toFixed(2) + " s";
      c.field("last-eviction").textContent = extra.last_eviction || "-";
      const error = c.field("last-error");
      error.hidden = !extra.last_error;
      error.textContent = extra.last_error ? "last error: " + extra.last_error : "";
    }
    for (const [model, c] of cards) {
      if (!seen.has(model)) {
        c.root.remove();
        cards.delete(model);
      }
    }
    syncFilterOptions();
    applyFilter();
  }

  // "3m05s", as troupe ps writes how long a child has been up.
  function duration(seconds) {
    const s = Math.floor(seconds);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  }

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  // The KV store's words for a model (docs/kv-store.md): the conversations it keeps for
  // the model, their size, and how many were restored into a slot or saved.
  function kvText(kv, counts) {
    if (!kv) return "off (--kv-store off)";
    const { restored = 0, saved = 0 } = counts || {};
    const held = kv.entries
      ? `${plural(kv.entries, "conversation")} stored (${bytesText(kv.bytes)})`
      : "no conversation stored yet";
    const done = `${restored} restored, ${saved} saved since start`;
    const off = kv.restore === "off" ? `; restores stopped: ${kv.restore_off}` : "";
    return `${held}; ${done}${off}`;
  }

  // What changes between /models reads: its streams' tokens per second and its KV counts.
  function renderLive(model, c) {
    const now = live.get(model);
    const last = lastSpeed.get(model);
    c.field("tokens-per-second").textContent = now
      ? `${now.tps.toFixed(1)} (${plural(now.streams, "stream")} now)`
      : last == null ? "-" : `none now (last request ${last.toFixed(1)})`;
    c.field("kv").textContent = kvText(c.kv, kvCounts.get(model));
  }

  // ----- the model filter ------------------------------------------------------------------

  function syncFilterOptions() {
    const select = $("model-filter");
    const names = [...cards.keys()].sort();
    const shown = [...select.options].slice(1).map((o) => o.value);
    if (names.join("\n") !== shown.join("\n")) {
      select.replaceChildren(select.options[0], ...names.map((name) => new Option(name, name)));
      if (filter && !cards.has(filter)) filter = ""; // (a name in the address no longer served)
      select.value = filter;
    }
  }

  function applyFilter() {
    const hidden = (model) => Boolean(filter) && model !== filter;
    for (const [model, c] of cards) c.root.hidden = hidden(model);
    for (const tr of $("activity-rows").children) tr.hidden = hidden(tr.dataset.model);
    if (charts.memory) {
      memoryKeys().forEach((key, i) => {
        const show = !hidden(key.split("|")[0]);
        if (charts.memory.series[i + 1].show !== show) charts.memory.setSeries(i + 1, { show });
      });
    }
    document.body.dataset.filter = filter;
  }

  $("model-filter").addEventListener("change", (event) => {
    filter = event.target.value;
    const address = location.pathname + location.search;
    window.history.replaceState(null, "", filter ? `${address}#model=${encodeURIComponent(filter)}` : address);
    applyFilter();
    drawCharts(); // (the total is the shown models')
  });

  async function refresh() {
    try {
      const resp = await api("/models", OWN_MODELS);
      if (!resp.ok) throw new Error("/models: " + (await errorText(resp)));
      renderModels((await resp.json()).data);
      showError("");
    } catch (err) {
      if (err instanceof NeedKey) return askForKey(err.message);
      showError(String(err));
    }
  }

  let refreshTimer = null;
  function refreshSoon() {
    if (refreshTimer === null) {
      refreshTimer = setTimeout(() => {
        refreshTimer = null;
        refresh();
      }, 100);
    }
  }

  function onModelEvent(_name, data) {
    const event = JSON.parse(data);
    const c = event.model && cards.get(event.model);
    const payload = event.data || {};
    if (c && payload.status) setStatus(c, payload.status);
    if (c && payload.status === "loading") {
      const bar = c.field("progress");
      bar.hidden = false;
      bar.value = payload.progress && typeof payload.progress.value === "number"
        ? payload.progress.value : 0;
    }
    refreshSoon();
  }

  // ----- logs ----------------------------------------------------------------------------

  function onLogEvent(name, data) {
    if (name !== "message") return; // "missed": lines this page read too slowly to see
    const line = JSON.parse(data);
    let log = logs.get(line.model);
    if (!log) logs.set(line.model, (log = { lines: [], lastSeq: 0 }));
    if (line.seq <= log.lastSeq) return; // replayed history after a reconnect
    log.lastSeq = line.seq;
    log.lines.push(line);
    if (log.lines.length > LOG_LINES) log.lines.splice(0, log.lines.length - LOG_LINES);
    scheduleLogRender(line.model);
  }

  const dirtyLogs = new Set();
  function scheduleLogRender(model) {
    if (dirtyLogs.size === 0) requestAnimationFrame(() => {
      for (const m of dirtyLogs) renderLog(m);
      dirtyLogs.clear();
    });
    dirtyLogs.add(model);
  }

  function renderLog(model) {
    const c = cards.get(model);
    const log = logs.get(model) || { lines: [] };
    if (!c) return;
    const pre = c.field("log");
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    const fragment = document.createDocumentFragment();
    for (const line of log.lines) {
      const row = document.createElement("div");
      row.className = line.source;
      const time = new Date(line.time * 1000).toLocaleTimeString();
      row.textContent = `${time} ${line.source === "troupe" ? "[troupe] " : ""}${line.text}`;
      fragment.appendChild(row);
    }
    pre.replaceChildren(fragment);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  // ----- charts from /metrics -------------------------------------------------------------

  function parseMetrics(text) {
    const out = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
      out.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return out;
  }

  const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
  const charts = { memory: null, requests: null };
  // models: "model|device" -> MiB its child held at each sample (null: no child then)
  const history = { t: [], models: new Map(), rps: [], inFlight: [] };
  let lastRequests = null;

  // The time axis: whole minutes only, written "14:05", at least 80 px apart, so its
  // labels never overlap (uPlot's own labels, "2:05:30pm" every 30 s, did at 400 px).
  const X_INCRS = [60, 120, 300, 600, 900, 1800, 3600];
  const X_SPACE = 80;
  const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: "numeric", minute: "2-digit" });

  // The y axis starts at 0: 29.90 to 29.93 MiB must not look like a climb.
  const fromZero = (_u, _min, max) => [0, max > 0 ? max * 1.15 : 1];

  function makeChart(el, labels) {
    const series = [{}].concat(labels.map((label, i) => ({
      label, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: true })));
    // The x axis always spans the whole window (seconds since the epoch, as uPlot's
    // time scale wants), so its ticks read as minutes, not milliseconds of a young page.
    const span = (CHART_POINTS * METRICS_EVERY) / 1000;
    const range = (_u, min, max) => [Math.min(min, max - span), max];
    const values = (u, splits) => {
      const texts = splits.map(clock);
      // Where each label went (the browser test measures them for overlaps).
      el.dataset.ticks = JSON.stringify(splits.map((s, i) => [u.valToPos(s, "x"), texts[i]]));
      return texts;
    };
    const axes = [{ space: X_SPACE, incrs: X_INCRS, values }, {}];
    return new uPlot({ width: el.clientWidth || 400, height: 170, series, axes,
                       scales: { x: { time: true, range }, y: { range: fromZero } },
                       legend: { live: false } },
                     [[]].concat(labels.map(() => [])), el);
  }

  // A memory series' key, "model|device", and its legend label ("tiny-a", "tiny-a cuda:0").
  const memoryKeys = () => [...history.models.keys()].sort();
  const memoryLabel = (key) => {
    const [model, device] = key.split("|");
    return device === "host" ? model : `${model} ${device}`;
  };

  // One sample of what each child holds: {model: {device: bytes}}.
  function pushMemory(held) {
    const seen = new Set();
    for (const [model, perDevice] of Object.entries(held)) {
      for (const [device, n] of Object.entries(perDevice)) {
        const key = `${model}|${device}`;
        if (!history.models.has(key)) history.models.set(key, history.t.slice(0, -1).map(() => null));
        push(history.models.get(key), n / MIB);
        seen.add(key);
      }
    }
    for (const [key, list] of history.models) {
      if (!seen.has(key)) push(list, null);
      if (list.every((v) => v === null)) history.models.delete(key); // out of the window
    }
  }

  function push(list, value) {
    list.push(value);
    if (list.length > CHART_POINTS) list.shift();
  }

  function recordMetrics(samples, now) {
    const value = (name, match = {}) => samples
      .filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v))
      .reduce((sum, s) => sum + s.value, 0);
    push(history.t, now);
    const held = {};
    for (const s of samples) {
      if (s.name !== "troupe_model_memory_observed_bytes") continue;
      (held[s.labels.model] ||= {})[s.labels.device] = s.value;
    }
    pushMemory(held);
    live.clear();
    for (const s of samples) {
      if (s.name === "troupe_model_stream_tokens_per_second") {
        const streams = value("troupe_model_streams", { model: s.labels.model });
        live.set(s.labels.model, { streams, tps: s.value });
      }
    }
    kvCounts.clear();
    for (const model of cards.keys()) {
      kvCounts.set(model, {
        restored: value("troupe_kv_restores_total", { model, result: "restored" }),
        saved: value("troupe_kv_saves_total", { model, result: "saved" }),
      });
    }
    for (const [model, c] of cards) renderLive(model, c);
    const requests = value("troupe_proxied_requests_total");
    const rate = lastRequests ? (requests - lastRequests.n) / Math.max(0.001, now - lastRequests.t) : 0;
    lastRequests = { n: requests, t: now };
    push(history.rps, Math.max(0, rate));
    push(history.inFlight, value("troupe_model_in_flight"));
    const running = value("troupe_models_running");
    const max = value("troupe_models_max");
    $("summary").textContent = `${cards.size} models, ${running} running` +
      (max ? ` (at most ${max})` : "") + `, ${value("troupe_queue_depth")} queued`;
  }

  // The server's recent samples: the charts start with the last minutes, not empty.
  async function loadHistory() {
    try {
      const resp = await api("/troupe/history");
      if (!resp.ok) return;
      const points = (await resp.json()).points || [];
      let previous = null;
      for (const p of points) {
        push(history.t, p.time);
        pushMemory(p.models || {});
        const rate = previous ? (p.requests - previous.requests) / Math.max(0.001, p.time - previous.time) : 0;
        push(history.rps, Math.max(0, rate));
        push(history.inFlight, p.in_flight);
        previous = p;
      }
      if (previous) lastRequests = { n: previous.requests, t: previous.time };
      $("charts").dataset.history = String(points.length);
      if (points.length) drawCharts();
    } catch (err) {
      if (err instanceof NeedKey) throw err;
    }
  }

  function drawCharts() {
    $("charts").dataset.points = String(history.t.length);
    const keys = memoryKeys();
    const labels = keys.map(memoryLabel);
    const drawn = charts.memory ? charts.memory.series.slice(1).map((s) => s.label) : null;
    if (!drawn || drawn.join("\n") !== labels.join("\n")) {
      if (charts.memory) charts.memory.destroy();
      charts.memory = makeChart($("chart-memory"), labels);
      $("chart-memory").dataset.series = JSON.stringify(labels);
      applyFilter();
    }
    charts.memory.setData([history.t, ...keys.map((k) => history.models.get(k))]);
    // What the children shown hold together now (the last sample).
    const together = keys.filter((k) => !filter || k.split("|")[0] === filter)
      .reduce((sum, k) => sum + (history.models.get(k).at(-1) ?? 0), 0);
    $("memory-total").textContent = keys.length ? `: ${together.toFixed(1)} MiB together now` : "";
    if (!charts.requests) charts.requests = makeChart($("chart-requests"), ["req/s", "in flight"]);
    charts.requests.setData([history.t, history.rps, history.inFlight]);
    const x = charts.requests.scales.x;
    $("charts").dataset.span = String(Math.round(x.max - x.min)); // seconds the x axis spans
  }

  async function pollMetrics(signal) {
    while (!signal.aborted) {
      try {
        const resp = await api("/metrics", { signal });
        if (resp.ok) {
          recordMetrics(parseMetrics(await resp.text()), Date.now() / 1000);
          drawCharts();
        }
        await refreshActivity(signal);
      } catch (err) {
        if (err instanceof NeedKey) return askForKey(err.message);
      }
      await sleep(METRICS_EVERY);
    }
  }

  // ----- recent requests (/troupe/requests) -------------------------------------------------

  const fmtMs = (s) => (s == null ? "-" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s");

  async function refreshActivity(signal) {
    const resp = await api("/troupe/requests?limit=" + ACTIVITY_ROWS, { signal });
    if (!resp.ok) return;
    const rows = (await resp.json()).data;
    const seenSpeed = new Set();
    const body = document.createDocumentFragment();
    for (const r of rows) {
      const tr = document.createElement("tr");
      tr.dataset.model = r.model;
      tr.dataset.status = String(r.status);
      if (!r.in_flight && r.tokens_per_second != null && !seenSpeed.has(r.model)) {
        seenSpeed.add(r.model); // the newest ended request of the model (rows: newest first)
        lastSpeed.set(r.model, r.tokens_per_second);
      }
      const tokens = r.prompt_tokens == null && r.completion_tokens == null
        ? "-" : `${r.prompt_tokens ?? 0} + ${r.completion_tokens ?? 0}`;
      const waited = (r.queue_wait || 0) + (r.load_wait || 0);
      const cells = [
        new Date(r.time * 1000).toLocaleTimeString(), r.model || "-", `${r.method} ${r.path}`,
        r.in_flight ? "running" : String(r.status), fmtMs(waited), fmtMs(r.ttft ?? r.ttfb),
        r.in_flight ? "-" : fmtMs(r.duration), tokens,
        r.tokens_per_second == null ? "-" : r.tokens_per_second.toFixed(1), r.error || "",
      ];
      for (const text of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      if (r.error) tr.className = "failed";
      body.appendChild(tr);
    }
    $("activity-rows").replaceChildren(body);
    applyFilter();
  }

  window.addEventListener("resize", () => {
    for (const [name, chart] of Object.entries(charts)) {
      const el = $(name === "memory" ? "chart-memory" : "chart-requests");
      if (chart) chart.setSize({ width: el.clientWidth, height: 170 });
    }
  });

  // ----- start ---------------------------------------------------------------------------

  async function start() {
    if (session) return;
    const controller = (session = new AbortController());
    const signal = controller.signal;
    setConnection("connecting");
    try {
      const resp = await api("/models", OWN_MODELS);
      if (!resp.ok) throw new Error("/models: " + (await errorText(resp)));
      renderModels((await resp.json()).data);
    } catch (err) {
      if (err instanceof NeedKey) return askForKey(err.message);
      showError(String(err));
    }
    if (signal.aborted) return;
    try {
      await loadHistory();
    } catch (err) {
      if (err instanceof NeedKey) return askForKey(err.message);
    }
    $("key-error").textContent = "";
    $("forget-key").hidden = !apiKey;
    const live = () => {
      setConnection("live");
      refreshSoon(); // whatever changed while the stream was down
    };
    follow("/models/sse", onModelEvent, live, signal);
    follow("/logs/stream", onLogEvent, () => {
      logs.clear(); // the stream starts with the recent lines again
      for (const model of cards.keys()) scheduleLogRender(model);
    }, signal);
    pollMetrics(signal);
    (async () => {
      while (!signal.aborted) {
        await sleep(MODELS_EVERY);
        if (!signal.aborted) refresh();
      }
    })();
  }

  start();
})();
