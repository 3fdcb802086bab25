// Keeps the experiment table live: polls the JSON API every 2 s while the tab is visible, with
// the list's filters and sort and as many rows as are shown, sending the ETag of the last answer
// so that an unchanged list costs a bodiless 304. Updates rows in place, adds rows for runs
// launched elsewhere, drops rows that left the filter; "More runs" follows the API's `next`, up
// to the rows one poll refreshes (the API's largest page);
// Import posts a file to the import API.
(function () {
  "use strict";

  const root = document.getElementById("experiment-list");
  if (!root) return;

  const POLL_MS = 2000;
  const MAX_BACKOFF_MS = 30000;
  const MAX_POLL_ROWS = 500; // the API's largest page
  const apiUrl = root.dataset.apiUrl;
  const pollQuery = root.dataset.pollQuery || "";
  const moreButton = document.getElementById("list-more");
  const countEl = document.getElementById("list-count");
  const showOwner = root.dataset.showOwner === "1";
  const tbody = document.getElementById("experiment-rows");
  const tableCard = document.getElementById("experiment-table-card");
  const emptyState = document.getElementById("empty-state");
  const liveNote = document.getElementById("list-live-status");
  const template = document.getElementById("experiment-row-template");
  const compareForm = document.getElementById("compare-form");
  const { setText, formatDuration, formatPercent, statusLabel, strategy, el, csrfToken } =
    window.Trainyard;

  let timer = null;
  let inFlight = null;
  let failures = 0;
  let stopped = false;
  let etag = null;

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

  function tagsOf(row, e) {
    const box = field(row, "tags");
    const tags = Array.isArray(e.tags) ? e.tags : [];
    if (box.dataset.tags === JSON.stringify(tags)) return;
    box.dataset.tags = JSON.stringify(tags);
    box.replaceChildren(
      ...tags.map((tag) => el("a", { class: "tag", href: "?tag=" + encodeURIComponent(tag) }, tag)),
    );
  }

  function updateRow(row, e) {
    row.dataset.status = e.status;
    row.dataset.started = e.started_at || "";
    tagsOf(row, e);
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
    // The full name, with the options off their default, in the server's words.
    const title = e.strategy_label || facts.label;
    if (abbr.title !== title) abbr.title = title;
    const model = field(row, "model");
    setText(model, e.model || "");
    model.title = "on " + (e.dataset || "") + (e.data_path ? " " + e.data_path : "");
    // Written by the server (core/descriptions.py: experiment_devices_label), as in the rows it rendered.
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
    return row;
  }

  function rowsById() {
    const rows = new Map();
    for (const row of tbody.rows) rows.set(row.dataset.id, row);
    return rows;
  }

  // The poll's answer holds every shown row in the list's order (its limit is the number
  // shown): rows keep their nodes (and ticks), move where the sort puts them, new runs come
  // in, runs that left the filter go.
  function apply(body, covered) {
    const rows = rowsById();
    let before = tbody.firstElementChild;
    for (const e of Array.isArray(body.experiments) ? body.experiments : []) {
      let row = rows.get(String(e.id));
      rows.delete(String(e.id));
      if (row) updateRow(row, e);
      else row = newRow(e);
      if (row !== before) tbody.insertBefore(row, before);
      before = row.nextElementSibling;
    }
    if (covered) for (const row of rows.values()) row.remove();
    showCount(body.count);
  }

  // Rows of an older page, never past MAX_POLL_ROWS: one poll refreshes every shown row.
  // Returns whether all of them fitted.
  function append(body) {
    const rows = rowsById();
    for (const e of Array.isArray(body.experiments) ? body.experiments : []) {
      const row = rows.get(String(e.id));
      if (row) {
        updateRow(row, e);
      } else if (tbody.rows.length >= MAX_POLL_ROWS) {
        showCount(body.count);
        return false;
      } else {
        const older = newRow(e);
        older.classList.remove("row-new"); // a page asked for, not a run that just came
        tbody.append(older);
      }
    }
    showCount(body.count);
    return true;
  }

  function showCount(count) {
    if (typeof count === "number") setText(countEl, count + (count === 1 ? " run" : " runs"));
    const any = tbody.rows.length > 0;
    tableCard.hidden = !any;
    emptyState.hidden = any || root.dataset.filtered === "1";
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
    const shown = tbody.rows.length;
    const limit = Math.min(MAX_POLL_ROWS, Math.max(shown, 50));
    const query = (pollQuery ? pollQuery + "&" : "") + "limit=" + limit;
    try {
      const headers = { Accept: "application/json" };
      if (etag) headers["If-None-Match"] = etag;
      const response = await fetch(apiUrl + "?" + query, {
        credentials: "same-origin",
        headers,
        cache: "no-store",
        signal: controller.signal,
      });
      if (response.status === 401 || response.status === 403) {
        stopped = true;
        note(null, 'Your session has ended. <a href="/accounts/login/?next=/">Log in again</a> to keep this list live.');
        return;
      }
      if (response.status !== 304) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        const body = await response.json();
        etag = response.headers.get("ETag");
        apply(body, shown <= limit);
      }
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

  // An active run's duration is left out of the list's ETag: it ticks here instead.
  function tick() {
    const now = Date.now();
    for (const row of tbody.rows) {
      if (row.dataset.status !== "running" || !row.dataset.started) continue;
      const started = Date.parse(row.dataset.started);
      if (!isNaN(started)) setText(field(row, "duration"), formatDuration((now - started) / 1000));
    }
  }

  async function more() {
    const url = moreButton.dataset.nextUrl;
    if (!url) return;
    moreButton.disabled = true;
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const body = await response.json();
      const fitted = append(body);
      const full = !fitted || (body.next && tbody.rows.length >= MAX_POLL_ROWS);
      moreButton.dataset.nextUrl = (!full && body.next) || "";
      moreButton.hidden = full || !body.next;
      if (full) {
        moreButton.after(
          el("span", { class: "muted small", id: "list-full" },
            MAX_POLL_ROWS + " runs are shown, as many as the list keeps live: " +
            "narrow it with the filters to find the others."),
        );
      }
    } catch (err) {
      note("Could not load more runs (" + err.message + ").");
    } finally {
      moreButton.disabled = false;
    }
  }

  // Import: the file goes to the import API as it is; its answer says what went wrong.
  const importForm = document.getElementById("import-form");
  const importFile = document.getElementById("import-file");
  const importError = document.getElementById("import-error");

  async function importPost() {
    if (!importFile.files.length) return;
    const data = new FormData();
    data.append("file", importFile.files[0]);
    importError.hidden = true;
    note("Importing " + importFile.files[0].name + "…");
    try {
      const response = await fetch(importForm.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
        body: data,
      });
      const body = await response.json().catch(() => ({}));
      if (response.status === 201 && body.url) {
        window.location.assign(body.url);
        return;
      }
      setText(importError, "Import refused: " + (body.error || "HTTP " + response.status));
      importError.hidden = false;
      note("");
    } catch (err) {
      setText(importError, "Import failed: " + err.message);
      importError.hidden = false;
    } finally {
      importFile.value = "";
    }
  }

  if (importFile) importFile.addEventListener("change", importPost);
  if (moreButton) moreButton.addEventListener("click", more);
  for (const el of root.querySelectorAll("time[datetime]")) localizeTime(el);
  setInterval(tick, 1000);
  schedule(POLL_MS);
})();
