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

  // 12s, 3m 05s, 1h 02m: dashboard/experiments/views.py format_duration() renders the first one.
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

  const statusLabel = (status) => facts.statuses[status] || status;
  const strategy = (name) => facts.strategies[name] || { label: name, short: name, processes: false };

  return {
    facts, isNum, setText, formatDuration, formatPercent, bytesText, csrfToken, el,
    statusLabel, strategy,
  };
})();
