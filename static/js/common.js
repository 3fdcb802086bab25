// What every page script shares, loaded by templates/base.html before them (all are deferred,
// so they run in order): small helpers, and the facts the server sends each page in
// #page-facts ({% page_facts %}): the strategies of training/registry.py and the model's status
// labels. Page scripts read them from here and keep no copy of their own.
window.Trainyard = (function () {
  "use strict";

  const factsEl = document.getElementById("page-facts");
  const facts = Object.assign(
    { strategies: {}, statuses: {}, active_statuses: [], final_statuses: [] },
    factsEl ? JSON.parse(factsEl.textContent) : {},
  );

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
  // message lost between us and the run) closes the socket with 4000, so that the reconnect's
  // snapshot brings it. Returns the handler for ws.onmessage.
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
        ws.close(4000, "gap");
        return;
      }
      lastSeq = msg.seq;
      onEvent(msg);
    };
  }

  const statusLabel = (status) => facts.statuses[status] || status;
  const strategy = (name) => facts.strategies[name] || { label: name, short: name, processes: false };

  return {
    facts, isNum, setText, formatDuration, formatPercent, bytesText, csrfToken, el, logLine,
    runSocketReader, statusLabel, strategy,
  };
})();
