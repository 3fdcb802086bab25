// What every page script shares, loaded by templates/base.html before them (all are deferred,
// so they run in order): small helpers, and the facts the server sends each page in
// #page-facts ({% page_facts %}): the strategies of training/registry.py, the model's status
// labels, the run socket's close codes and the series contract (which chart draws which series).
// Page scripts read them from here and keep no copy of their own.
window.Trainyard = (function () {
  "use strict";

  const factsEl = document.getElementById("page-facts");
  const facts = Object.assign(
    {
      strategies: {}, statuses: {}, active_statuses: [], final_statuses: [], socket_close: {},
      series: { charts: [], step_series: {}, epoch_series: {}, rank_fields: [] },
    },
    factsEl ? JSON.parse(factsEl.textContent) : {},
  );
  // The run socket's close codes (core/messages.py SocketClose): final, resync, and the
  // consumer's refusals, unauthenticated and forbidden.
  const CLOSE = facts.socket_close;

  const isNum = (v) => typeof v === "number" && isFinite(v);

  function setText(el, text) {
    if (el && el.textContent !== String(text)) el.textContent = String(text);
  }

  // 12s, 3m 05s, 1h 02m: dashboard/experiments/web/views.py format_duration() renders the first one.
  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) return "—";
    const total = Math.max(0, Math.floor(seconds));
    const h = Math.floor(total / 3600);
    const m = Math.floor((total % 3600) / 60);
    const s = total % 60;
    const pad = (n) => String(n).padStart(2, "0");
    if (h) return h + "h " + pad(m) + "m";
    if (m) return m + "m " + pad(s) + "s";
    return s + "s";
  }

  const formatPercent = (f) => (isNum(f) ? (f * 100).toFixed(2) + "%" : "—");

  // For a value the server did not send as text (devices.js; live figures of a run).
  function bytesText(value) {
    if (!isNum(value)) return "?";
    let amount = value;
    for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
      if (Math.abs(amount) < 1024 || unit === "TiB") {
        return unit === "B" ? amount.toFixed(0) + " B" : amount.toFixed(1) + " " + unit;
      }
      amount /= 1024;
    }
    return "?";
  }

  function csrfToken() {
    const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    const input = document.querySelector('input[name="csrfmiddlewaretoken"]');
    return input ? input.value : "";
  }

  // An element from a tag, attributes and children (text or nodes): never an HTML string,
  // because the values come from runs' and workers' reports.
  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else node.setAttribute(key, value);
    }
    for (const child of [].concat(children ?? [])) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  // One log line as the run page and the logs page show it: time, rank, message.
  function logLine(line) {
    const level = String(line.level || "info").replace(/[^a-z]/g, "");
    const attrs = { class: "log-" + level };
    if (isNum(line.seq)) attrs["data-seq"] = String(line.seq); // the logs page pages by it
    return el("li", attrs, [
      // Plain output lines carry no time (stored as 0).
      el(
        "span", { class: "log-time" },
        isNum(line.time) && line.time > 0 ? line.time.toFixed(1) + "s" : "",
      ),
      // The rank whose stderr (or rank 0's event) it was; none for the dashboard's own lines.
      el("span", { class: "log-rank" }, isNum(line.rank) ? "r" + line.rank : ""),
      // The machine that relayed it, on a run over several machines.
      ...(line.machine ? [el("span", { class: "log-machine" }, line.machine)] : []),
      el("span", { class: "log-msg" }, line.message),
    ]);
  }

  // A run's socket (/ws/experiments/<id>/, dashboard/experiments/web/consumers.py) read in order:
  // the snapshot says where the count stands, an event already had is dropped, and a gap (a
  // message lost between us and the run) closes the socket with CLOSE.resync, so that the
  // reconnect's snapshot brings it. Returns the handler for ws.onmessage.
  function runSocketReader(ws, { onSnapshot, onEvent }) {
    let lastSeq = 0;
    return (event) => {
      let msg;
      try {
        msg = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (!msg || typeof msg !== "object") return;
      if (msg.type === "snapshot") {
        lastSeq = isNum(msg.seq) ? msg.seq : 0;
        onSnapshot(msg);
        return;
      }
      if (!isNum(msg.seq) || msg.seq <= lastSeq) return;
      if (msg.seq > lastSeq + 1) {
        ws.close(CLOSE.resync, "gap");
        return;
      }
      lastSeq = msg.seq;
      onEvent(msg);
    };
  }

  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  // Open this long, a socket counts as having worked: the next drop starts the backoff afresh.
  const STABLE_MS = 30000;
  const CLOSED_TEXTS = {
    [CLOSE.unauthenticated]: "closed: log in again to follow the run",
    [CLOSE.forbidden]: "closed: not allowed",
  };

  /** A run's socket (path: core/messages.py socket_path, sent by the page), read in order by
   * runSocketReader and reconnected with a jittered backoff (1 s doubling to 30 s) until the run
   * is final or the server refuses. opts: onSnapshot(msg) and onEvent(msg); isFinal() (checked
   * after each message and close: nothing more comes, so the socket closes for good);
   * onState(kind, text, title) with kind connecting, reconnecting, live or closed; checkUrl (an
   * API URL asked after a refused handshake, which the browser reports as a plain drop, 1006:
   * 401, 403 or 404 there mean stop). Returns {close(): for good, resync(reason): reconnect at
   * once for a fresh snapshot}. */
  function runSocket(path, opts) {
    const isFinal = opts.isFinal || (() => false);
    const onState = opts.onState || (() => {});
    let socket = null, attempts = 0, retryTimer = null, openedAt = 0, closedForGood = false;

    function stop(text) {
      closedForGood = true;
      clearTimeout(retryTimer);
      retryTimer = null;
      onState("closed", text || "closed", "");
    }

    function connect() {
      clearTimeout(retryTimer);
      retryTimer = null;
      if (closedForGood || !path || typeof WebSocket === "undefined") return;
      onState(attempts ? "reconnecting" : "connecting", attempts ? "reconnecting…" : "connecting…", "");
      const scheme = location.protocol === "https:" ? "wss://" : "ws://";
      let ws;
      try {
        ws = new WebSocket(scheme + location.host + path);
      } catch (err) {
        scheduleReconnect();
        return;
      }
      socket = ws;
      let opened = false;
      ws.onopen = () => {
        opened = true;
        openedAt = Date.now();
        onState("live", "live", "");
      };
      // Nothing more will come once the run is final; the server keeps the record.
      const closeIfFinal = () => {
        if (ws.readyState !== WebSocket.OPEN || !isFinal()) return;
        closedForGood = true;
        ws.close(CLOSE.final, "final");
      };
      const read = runSocketReader(ws, {
        onSnapshot(msg) {
          opts.onSnapshot(msg);
          closeIfFinal();
        },
        onEvent(msg) {
          attempts = 0;
          opts.onEvent(msg);
          closeIfFinal();
        },
      });
      ws.onmessage = (event) => {
        if (socket === ws) read(event);
      };
      ws.onclose = (event) => {
        if (socket !== ws) return;
        socket = null;
        if (Date.now() - openedAt > STABLE_MS) attempts = 0;
        if (CLOSED_TEXTS[event.code]) return stop(CLOSED_TEXTS[event.code]);
        if (closedForGood || isFinal()) return stop();
        // Our own close for a fresh snapshot: at once, the first time.
        if (event.code === CLOSE.resync && attempts === 0) {
          attempts = 1;
          return connect();
        }
        if (!opened && opts.checkUrl) return explainRefusal();
        scheduleReconnect();
      };
    }

    function explainRefusal() {
      fetch(opts.checkUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then((response) => {
          if (response.status === 401) stop(CLOSED_TEXTS[CLOSE.unauthenticated]);
          else if (response.status === 403 || response.status === 404) stop(CLOSED_TEXTS[CLOSE.forbidden]);
          else scheduleReconnect();
        })
        .catch(scheduleReconnect);
    }

    function scheduleReconnect() {
      const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** attempts);
      const delay = Math.round(base * (0.7 + Math.random() * 0.6));
      attempts += 1;
      onState("reconnecting", "reconnecting…", "next try in " + Math.ceil(delay / 1000) + " s");
      clearTimeout(retryTimer);
      retryTimer = setTimeout(connect, delay);
    }

    // Coming back online or to the tab: no need to sit out the backoff.
    function retrySoon() {
      if (retryTimer && !closedForGood && !document.hidden) {
        attempts = 0;
        connect();
      }
    }
    window.addEventListener("online", retrySoon);
    document.addEventListener("visibilitychange", retrySoon);

    connect();
    return {
      close() {
        if (!socket) return stop();
        closedForGood = true;
        clearTimeout(retryTimer);
        socket.close(CLOSE.final, "final");
      },
      resync(reason) {
        if (socket) socket.close(CLOSE.resync, reason);
      },
    };
  }

  // Stop and Cancel ask first where a run was launched long ago: the server's question and
  // the moment from which it is asked (dashboard/texts.py end_confirm).
  function endConfirmed(ask) {
    if (!ask || !ask.text || !(Date.now() / 1000 >= Number(ask.from))) return true;
    return window.confirm(ask.text);
  }

  const statusLabel = (status) => facts.statuses[status] || status;
  const strategy = (name) => facts.strategies[name] || { label: name, short: name, processes: false };

  return {
    facts, isNum, setText, formatDuration, formatPercent, bytesText, csrfToken, el, logLine,
    runSocketReader, runSocket, statusLabel, strategy, endConfirmed,
  };
})();
