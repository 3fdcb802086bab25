// The compare page (templates/experiments/compare.html): every series of the compared runs
// overlaid, one colour per run, drawn by static/js/charts.js; runs still training follow their
// WebSocket (/ws/experiments/<id>/: a snapshot, then step, epoch and series events); beside it
// speedup and efficiency against world size. The server listed only runs the viewer may see.
(function () {
  "use strict";

  const dataEl = document.getElementById("compare-charts");
  if (!dataEl) return;
  const { isNum, strategy, runSocket } = window.Trainyard;
  const Charts = window.TrainyardCharts;
  const { runs, scaling } = JSON.parse(dataEl.textContent);
  const box = document.getElementById("charts");

  async function getJson(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error("the server answered " + response.status);
    return response.json();
  }

  // A drag-zoom asks the line's run for finer buckets of its step range.
  async function fetchRange(line, from, to) {
    const { key, run } = line.meta;
    try {
      const body = await getJson(run.metrics_url + "?keys=" + encodeURIComponent(key) + "&from=" + from + "&to=" + to);
      return (body.series || {})[key] || null;
    } catch (err) {
      return null;
    }
  }

  const set = new Charts.ChartSet(box, { xMode: "images", fetchRange });
  Charts.xSelectBind(document.getElementById("chart-x"), set);

  runs.forEach((run, i) => {
    run.color = Charts.PALETTE[i % Charts.PALETTE.length];
    run.ctx = { globalBatch: run.global_batch, startedAt: run.started_at ? Date.parse(run.started_at) / 1000 : null };
  });

  // Our charts first in their order, then other series (imported runs' tags) by name.
  function keyOrder(a, b) {
    const rank = (k) => {
      const found = Charts.specOf(k);
      return found ? Charts.SPECS.indexOf(found.spec) : Charts.SPECS.length;
    };
    return rank(a) - rank(b) || a.localeCompare(b);
  }

  // A key's chart and the run's line there: a per-rank figure's lines are named by run and rank,
  // and grouped by rank (the chart draws one rank at a time, picked in its select).
  function lineOf(run, key) {
    const { spec, group } = Charts.keyChart(key);
    return {
      chart: set.chart(spec),
      name: group === undefined ? run.label : run.label + " · " + group,
      opts: { color: run.color, ctx: run.ctx, meta: { key, run }, group },
    };
  }

  function setRunSeries(run, series) {
    for (const [key, s] of Object.entries(series || {})) {
      const at = lineOf(run, key);
      at.chart.setLine(at.name, Object.assign({ series: s }, at.opts));
    }
  }

  function follow(run) {
    if (!run.active) return;
    runSocket(run.ws_path, {
      isFinal: () => !run.active,
      onSnapshot(msg) {
        setRunSeries(run, msg.series);
        for (const chart of set.charts.values()) chart.schedule();
        run.active = !msg.experiment || msg.experiment.status === "queued" || msg.experiment.status === "running";
      },
      onEvent(msg) {
        if (msg.type === "started" && isNum(msg.global_batch_size)) run.ctx.globalBatch = msg.global_batch_size;
        for (const [key, points] of Object.entries(Charts.messagePoints(msg))) {
          const at = lineOf(run, key);
          at.chart.append(at.name, points, at.opts);
        }
        if (msg.type === "finished" || msg.type === "failed") run.active = false;
      },
    });
  }

  async function load() {
    const answers = await Promise.all(runs.map((run) => getJson(run.metrics_url).catch(() => null)));
    const keys = new Set();
    for (const body of answers) Object.keys((body && body.series) || {}).forEach((k) => keys.add(k));
    document.getElementById("charts-loading").remove();
    // Charts made in key order, so that the page reads the same for every set of runs.
    for (const key of [...keys].sort(keyOrder)) set.chart(Charts.keyChart(key).spec);
    answers.forEach((body, i) => {
      if (body) setRunSeries(runs[i], body.series);
    });
    set.redrawAll();
    requestAnimationFrame(() => document.querySelector("main").setAttribute("data-charts-ready", "true"));
    runs.forEach(follow);
  }

  Charts.scalingChart(document.getElementById("scaling-chart"), scaling, (name) => strategy(name).short);
  load();
})();
