// Keeps the experiment table live: polls the JSON API every 2 s while the tab is visible,
// updates rows in place and adds rows for runs launched elsewhere.
(function () {
  "use strict";

  const root = document.getElementById("experiment-list");
  if (!root) return;

  const POLL_MS = 2000;
  const MAX_BACKOFF_MS = 30000;
  const apiUrl = root.dataset.apiUrl;
  const showOwner = root.dataset.showOwner === "1";
  const tbody = document.getElementById("experiment-rows");
  const tableCard = document.getElementById("experiment-table-card");
  const emptyState = document.getElementById("empty-state");
  const liveNote = document.getElementById("list-live-status");
  const template = document.getElementById("experiment-row-template");
  const compareForm = document.getElementById("compare-form");
  const { setText, formatDuration, formatPercent, statusLabel, strategy } = window.Trainyard;

  let timer = null;
  let inFlight = null;
  let failures = 0;
  let stopped = false;

  // "Dec 2, 11:51" this year, "Dec 2, 2025, 11:51" before.
  const thisYear = new Date().getFullYear();
  const shortDate = new Intl.DateTimeFormat(undefined, {
    month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  });
  const longDate = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  });

  function localizeTime(el) {
    const iso = el.getAttribute("datetime");
    if (!iso) return;
    const date = new Date(iso);
    if (isNaN(date)) return;
    const text = (date.getFullYear() === thisYear ? shortDate : longDate).format(date);
    if (el.textContent !== text) el.textContent = text;
    el.title = date.toString();
  }

  function progressOf(e) {
    if (e.status === "succeeded") return 100;
    if (!e.total_steps) return 0;
    return Math.min(100, Math.round((1000 * e.step) / e.total_steps) / 10);
  }

  function field(row, name) {
    return row.querySelector('[data-field="' + name + '"]');
  }

  function updateRow(row, e) {
    const link = field(row, "name");
    setText(link, e.name);
    if (e.url && link.getAttribute("href") !== e.url) link.setAttribute("href", e.url);
    setText(field(row, "id"), "#" + e.id);
    if (showOwner) setText(field(row, "owner"), e.owner || "");

    const badge = field(row, "status");
    const badgeClass = "badge status-" + e.status;
    if (badge.className !== badgeClass) badge.className = badgeClass;
    setText(badge, statusLabel(e.status));

    const facts = strategy(e.strategy);
    const abbr = field(row, "strategy");
    setText(abbr, facts.short);
    if (abbr.title !== facts.label) abbr.title = facts.label;
    // Written by the server (Experiment.devices_label), as in the rows it rendered.
    setText(field(row, "devices"), e.devices_label || "");

    const pct = progressOf(e);
    const bar = field(row, "progress");
    bar.setAttribute("aria-valuenow", String(pct));
    bar.setAttribute("aria-label", "Progress of " + e.name);
    bar.firstElementChild.style.width = pct + "%";
    const fillClass = "status-" + e.status;
    if (bar.firstElementChild.className !== fillClass) bar.firstElementChild.className = fillClass;
    setText(field(row, "progress-text"), e.total_steps ? e.step + " / " + e.total_steps : "—");

    setText(field(row, "accuracy"), formatPercent(e.test_accuracy));
    const created = field(row, "created");
    if (e.created_at && created.getAttribute("datetime") !== e.created_at) {
      created.setAttribute("datetime", e.created_at);
      localizeTime(created);
    }
    setText(field(row, "duration"), formatDuration(e.duration));
  }

  function newRow(e) {
    const row = template.content.firstElementChild.cloneNode(true);
    row.dataset.id = String(e.id);
    const compare = field(row, "compare");
    compare.value = String(e.id);
    compare.setAttribute("aria-label", "Compare #" + e.id);
    row.classList.add("row-new");
    updateRow(row, e);
    // Newest first: ids grow with creation, so insert before the first older row.
    let before = null;
    for (const other of tbody.rows) {
      if (Number(other.dataset.id) < e.id) {
        before = other;
        break;
      }
    }
    tbody.insertBefore(row, before);
    return row;
  }

  function apply(experiments) {
    const rows = new Map();
    for (const row of tbody.rows) rows.set(row.dataset.id, row);
    for (const e of experiments) {
      const row = rows.get(String(e.id));
      if (row) updateRow(row, e);
      else newRow(e);
    }
    const any = tbody.rows.length > 0;
    tableCard.hidden = !any;
    emptyState.hidden = any;
    if (compareForm) compareForm.hidden = !any;
  }

  function note(text, html) {
    if (html) liveNote.innerHTML = html;
    else setText(liveNote, text);
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = null;
    if (stopped || document.hidden) return;
    timer = setTimeout(poll, delay);
  }

  async function poll() {
    timer = null;
    if (stopped || document.hidden || inFlight) return;
    const controller = new AbortController();
    inFlight = controller;
    const timeout = setTimeout(() => controller.abort(), 10000);
    try {
      const response = await fetch(apiUrl, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
        cache: "no-store",
        signal: controller.signal,
      });
      if (response.status === 401 || response.status === 403) {
        stopped = true;
        note(null, 'Your session has ended. <a href="/accounts/login/?next=/">Log in again</a> to keep this list live.');
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      const body = await response.json();
      apply(Array.isArray(body.experiments) ? body.experiments : []);
      failures = 0;
      note("");
    } catch (err) {
      failures += 1;
      note("Could not refresh the list (" + (err.name === "AbortError" ? "timed out" : err.message) + "); retrying…");
    } finally {
      clearTimeout(timeout);
      inFlight = null;
    }
    schedule(failures ? Math.min(MAX_BACKOFF_MS, POLL_MS * 2 ** failures) : POLL_MS);
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      clearTimeout(timer);
      timer = null;
    } else {
      schedule(0);
    }
  });

  for (const el of root.querySelectorAll("time[datetime]")) localizeTime(el);
  schedule(POLL_MS);
})();
