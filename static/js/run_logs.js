// The run page's log panel beyond the live tail: a rank and level filter, the whole log a page
// at a time, and a download of it as text. The live box (#log-box, kept by experiment_detail.js
// from the socket) shows the latest lines; once a filter is set or "Whole log" pressed, this
// script shows #log-pages instead, read from GET /api/experiments/<id>/logs/ (which does the
// filtering: "warnings and worse" is the server's rule, not a copy of it here). While the run
// logs more, new lines are fetched after the last one shown when the live box grows. The Rank
// filter offers each rank as it first logs, live.
(function () {
  "use strict";

  const root = document.getElementById("run-logs");
  if (!root) return;

  const PAGE_LINES = 500;
  const { el, setText, logLine } = window.Trainyard;
  const logsUrl = root.dataset.logsUrl;
  const liveBox = document.getElementById("log-box");
  const pagesBox = document.getElementById("log-pages");
  const rankSelect = document.getElementById("log-rank");
  const levelSelect = document.getElementById("log-level");
  const wholeButton = document.getElementById("log-whole");
  const latestButton = document.getElementById("log-latest");
  const download = document.getElementById("log-download");
  const pager = document.getElementById("log-pager");
  const moreButton = document.getElementById("log-more");
  const pagerStatus = document.getElementById("log-pager-status");
  const scope = document.getElementById("log-scope");

  let paged = false;
  let nextUrl = null; // the API's next page; null once the end was read
  let lastSeq = null;
  let loading = false;
  let generation = 0; // a filter change makes answers to older requests stale

  function filterParams() {
    const params = new URLSearchParams();
    if (rankSelect.value) params.set("rank", rankSelect.value);
    if (levelSelect.value) params.set("level", levelSelect.value);
    return params;
  }

  function withParams(extra) {
    const params = filterParams();
    for (const [key, value] of Object.entries(extra)) params.set(key, value);
    const query = params.toString();
    return logsUrl + (query ? "?" + query : "");
  }

  // Each rank once, in order, after "every rank": a rank that first logs late (rank 1 at its
  // start, after the page loaded) takes its place among the others.
  function ranksShow(ranks) {
    const have = new Set(Array.from(rankSelect.options, (o) => o.value));
    for (const rank of ranks || []) {
      if (!Number.isInteger(rank) || have.has(String(rank))) continue;
      have.add(String(rank));
      const option = el("option", { value: String(rank) }, "rank " + rank);
      const after = Array.from(rankSelect.options).find((o) => o.value !== "" && Number(o.value) > rank);
      rankSelect.insertBefore(option, after || null);
    }
  }

  async function fetchPage(url) {
    const mine = generation;
    loading = true;
    try {
      const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error("HTTP " + response.status);
      const body = await response.json();
      if (mine !== generation) return;
      ranksShow(body.ranks);
      if (!paged) return;
      const fragment = document.createDocumentFragment();
      for (const line of body.lines) fragment.append(logLine(line));
      pagesBox.append(fragment);
      if (body.lines.length) lastSeq = body.lines[body.lines.length - 1].seq;
      nextUrl = body.next;
      moreButton.hidden = !nextUrl;
      setText(pagerStatus, pagesBox.children.length + " lines shown" + (nextUrl ? "" : ", to the end"));
    } catch (err) {
      setText(pagerStatus, "Could not read the log (" + err.message + ").");
    } finally {
      loading = false;
    }
  }

  function show() {
    generation += 1;
    paged = Boolean(rankSelect.value || levelSelect.value) || paged;
    download.href = withParams({ format: "text" });
    liveBox.hidden = paged;
    pagesBox.hidden = !paged;
    pager.hidden = !paged;
    latestButton.hidden = !paged;
    wholeButton.hidden = paged;
    setText(scope, paged ? "from the start, a page at a time" : "latest lines, live");
    if (!paged) return;
    pagesBox.replaceChildren();
    nextUrl = null;
    lastSeq = null;
    fetchPage(withParams({ limit: String(PAGE_LINES) }));
  }

  wholeButton.addEventListener("click", function () {
    paged = true;
    show();
  });
  latestButton.addEventListener("click", function () {
    paged = false;
    rankSelect.value = "";
    levelSelect.value = "";
    show();
  });
  rankSelect.addEventListener("change", show);
  levelSelect.addEventListener("change", show);
  moreButton.addEventListener("click", function () {
    if (nextUrl && !loading) fetchPage(nextUrl);
  });

  // The run logged more (the live box grew): at the end of the pages, read what follows.
  let pending = null;
  new MutationObserver(function () {
    if (!paged || nextUrl || pending) return;
    pending = setTimeout(function () {
      pending = null;
      if (!paged || nextUrl || loading) return;
      const after = lastSeq === null ? {} : { after: String(lastSeq) };
      fetchPage(withParams({ ...after, limit: String(PAGE_LINES) }));
    }, 500);
  }).observe(liveBox, { childList: true });

  // The ranks that logged, for the filter: one line's request brings them, then the run's live
  // messages (static/js/experiment_detail.js announces each) those that log later.
  fetchPage(logsUrl + "?limit=1");
  const page = document.getElementById("experiment-detail");
  if (page) {
    page.addEventListener("run:message", function (event) {
      const msg = event.detail || {};
      if (msg.type === "log") ranksShow([msg.rank]);
      else if (Array.isArray(msg.logs)) ranksShow(msg.logs.map((line) => line.rank));
    });
  }
})();
