// The study page (templates/studies/detail.html), live: while any run is queued or running it
// reads GET /api/studies/<id>/ every few seconds and places what the server wrote (progress
// counts, the sentence naming the fastest cell, each cell's texts, the status) and redraws the
// speedup chart; the curves are compare.js's, which follows each run over its WebSocket.
// Nothing is formatted here.
(function () {
  "use strict";

  const liveEl = document.getElementById("study-live");
  if (!liveEl) return;
  const { setText, strategy } = window.Trainyard;
  const { api_url: apiUrl } = JSON.parse(liveEl.textContent);
  const POLL_MS = 3000;
  const ACTIVE = new Set(["queued", "running"]);
  let chartKey = JSON.stringify(JSON.parse(document.getElementById("compare-charts").textContent).scaling);

  function progressPlace(progress) {
    for (const [key, value] of Object.entries(progress)) {
      setText(document.querySelector('#study-progress [data-count="' + key + '"]'), value);
    }
    const bar = document.getElementById("study-progress-bar");
    bar.max = progress.total;
    bar.value = progress.succeeded;
  }

  function cellsPlace(cells) {
    cells.forEach((cell, i) => {
      const row = document.querySelector('#cell-rows tr[data-cell="' + i + '"]');
      if (!row) return;
      for (const [key, text] of Object.entries(cell.texts)) setText(row.querySelector('[data-text="' + key + '"]'), text);
    });
  }

  function scalingPlace(chart) {
    const key = JSON.stringify(chart);
    if (key === chartKey || !window.TrainyardCharts) return;
    chartKey = key;
    const box = document.getElementById("scaling-chart");
    box.querySelectorAll(".uplot").forEach((node) => node.remove());
    window.TrainyardCharts.scalingChart(box, chart, (name) => strategy(name).short);
  }

  // What each cell's efficiency lost to, as the server wrote it (studies/cells.py scaling_build).
  function reasonsPlace(reasons) {
    const list = document.getElementById("scaling-reasons");
    if (!list || !reasons.length) return;
    list.replaceChildren(...reasons.map((reason) => {
      const li = document.createElement("li");
      li.dataset.cell = reason.cell;
      li.textContent = reason.text;
      return li;
    }));
  }

  async function poll() {
    let body = null;
    try {
      const response = await fetch(apiUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) body = await response.json();
    } catch (err) {
      body = null; // the server is restarting: try again at the next tick
    }
    if (body) {
      progressPlace(body.progress);
      setText(document.querySelector("#study-fastest strong"), body.fastest_text);
      cellsPlace(body.cells);
      scalingPlace(body.scaling.chart);
      reasonsPlace(body.scaling.reasons || []);
      const badge = document.getElementById("study-status");
      setText(badge, body.status);
      badge.className = "badge status-" + body.status;
      const stop = document.getElementById("study-stop-form");
      if (stop) stop.hidden = !ACTIVE.has(body.status);
      document.querySelector("main").setAttribute("data-study-status", body.status);
      if (!ACTIVE.has(body.status)) return;
    }
    setTimeout(poll, POLL_MS);
  }

  poll();
})();
