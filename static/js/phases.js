// Where each rank's step goes (templates/experiments/_phases.html): a stacked bar per rank for the
// latest window and each phase's share of wall time per window over the run (uPlot), for one rank
// chosen in a select. It reads the embedded snapshot, then follows the page's own socket through
// the run:message events experiment_detail.js announces (a snapshot on every connect, then step
// messages whose `ranks` carry the phases): no polling of its own. The phases' names, labels and
// colours are the page facts' (dashboard/experiments/metrics/phases.py); nothing is kept here.
//
// It loads before common.js (its tag is in the partial), so it starts at DOMContentLoaded, when
// every deferred script has run; by then experiment_detail.js has drawn the embedded snapshot,
// and the socket's first message is still to come.
(function () {
  "use strict";

  // Bucket fields (the series contract: dashboard/experiments/metrics/series.py).
  const SF = 0, SL = 1, MEAN = 6, LAST = 7, N = 8;

  function start() {
    const box = document.getElementById("phases");
    const root = document.getElementById("experiment-detail");
    if (!box || !root || !window.Trainyard) return;
    const { facts, el, isNum, bytesText, setText } = window.Trainyard;
    const Axis = window.TrainyardAxis;
    const { phases, bytes_field: BYTES, not_measured: NOT_MEASURED } = facts.phases;
    const FIELDS = new Set([...phases.map((p) => p.field), BYTES]);
    const FINAL = new Set(facts.final_statuses);
    const css = getComputedStyle(document.documentElement);
    const colorOf = (phase) => css.getPropertyValue(phase.color).trim() || "#888";
    const $ = (id) => document.getElementById(id);

    // rank -> step -> {field: seconds or bytes}; the latest window per rank; steps per window.
    const state = { rows: new Map(), latest: new Map(), windowSteps: null, lastStep: null, status: null };
    let chart = null;
    let pending = false;

    function rowAt(rank, step) {
      if (!state.rows.has(rank)) state.rows.set(rank, new Map());
      const steps = state.rows.get(rank);
      if (!steps.has(step)) steps.set(step, {});
      return steps.get(step);
    }

    /** A snapshot's buckets: each bucket's mean at its last step; each series' last value is
     * the rank's latest window. */
    function fromSnapshot(msg) {
      state.rows.clear();
      state.latest.clear();
      state.windowSteps = null;
      state.status = msg.experiment ? msg.experiment.status : state.status;
      for (const [key, series] of Object.entries(msg.series || {})) {
        const m = /^rank\/(\d+)\/(\w+)$/.exec(key);
        if (!m || !FIELDS.has(m[2]) || !series.buckets.length) continue;
        const rank = Number(m[1]);
        for (const b of series.buckets) rowAt(rank, b[SL])[m[2]] = b[MEAN];
        const last = series.buckets[series.buckets.length - 1];
        if (!state.latest.has(rank)) state.latest.set(rank, { step: last[SL] });
        state.latest.get(rank)[m[2]] = last[LAST];
        if (rank === 0 && m[2] === "other_seconds") state.windowSteps = windowStepsOf(series.buckets);
      }
      state.lastStep = state.latest.has(0) ? state.latest.get(0).step : null;
    }

    /** Steps per window: a merged bucket's spacing, else the gap to the bucket before. */
    function windowStepsOf(buckets) {
      const last = buckets[buckets.length - 1];
      if (last[N] > 1) return (last[SL] - last[SF]) / (last[N] - 1);
      return buckets.length > 1 ? last[SL] - buckets[buckets.length - 2][SL] : last[SL];
    }

    /** A live step message: its ranks' phases are the latest window of each. */
    function fromStep(msg) {
      if (!isNum(msg.step) || !Array.isArray(msg.ranks)) return false;
      let any = false;
      for (const r of msg.ranks) {
        if (!r || !isNum(r.rank) || !isNum(r.other_seconds)) continue;
        const row = rowAt(r.rank, msg.step);
        const latest = { step: msg.step };
        for (const field of FIELDS) if (isNum(r[field])) row[field] = latest[field] = r[field];
        state.latest.set(r.rank, latest);
        any = true;
      }
      if (any) {
        if (isNum(state.lastStep) && msg.step > state.lastStep) state.windowSteps = msg.step - state.lastStep;
        state.lastStep = msg.step;
      }
      return any;
    }

    const wallOf = (row) => phases.reduce((sum, p) => sum + (isNum(row[p.field]) ? row[p.field] : 0), 0);
    const pct = (part, whole) => (whole > 0 ? (100 * part) / whole : 0);

    function legendDraw() {
      $("phases-legend").replaceChildren(...phases.map((p) => el("li", {}, [
        el("span", { class: "swatch", style: "background:" + colorOf(p) }), p.label,
      ])));
    }

    function barsDraw() {
      const items = [];
      for (const rank of [...state.latest.keys()].sort((a, b) => a - b)) {
        const row = state.latest.get(rank);
        const wall = wallOf(row);
        const parts = phases.map((p) => {
          const seconds = isNum(row[p.field]) ? row[p.field] : 0;
          const share = pct(seconds, wall);
          return el("span", {
            "data-phase": p.name, "data-share": share.toFixed(2),
            style: "width:" + share.toFixed(2) + "%;background:" + colorOf(p),
            title: p.label + ": " + seconds.toFixed(3) + " s (" + share.toFixed(0) + "%)",
          });
        });
        items.push(el("li", { "data-rank": rank }, [
          el("span", {}, "rank " + rank),
          el("span", { class: "phase-bar", role: "img", "aria-label": barLabel(row, wall) }, parts),
          el("span", { class: "muted small" }, besideText(row, wall)),
        ]));
      }
      $("phase-bars").replaceChildren(...items);
    }

    function barLabel(row, wall) {
      return phases.map((p) => p.label + " " + pct(row[p.field] || 0, wall).toFixed(0) + "%").join(", ");
    }

    /** The window's wall time and what the rank sent per step. */
    function besideText(row, wall) {
      let text = wall.toFixed(3) + " s";
      if (isNum(row[BYTES])) {
        const steps = isNum(state.windowSteps) && state.windowSteps > 0 ? state.windowSteps : 1;
        text += " · " + bytesText(row[BYTES] / steps) + " sent per step";
      }
      return text;
    }

    function rankSelectFill() {
      const select = $("phases-rank");
      const ranks = [...state.rows.keys()].sort((a, b) => a - b).map(String);
      if ([...select.options].map((o) => o.value).join() === ranks.join()) return;
      const keep = select.value;
      select.replaceChildren(...ranks.map((r) => el("option", { value: r }, r)));
      select.value = ranks.includes(keep) ? keep : ranks[0];
    }

    /** x: the window's last step; per phase its share of the window's wall time, in percent. */
    function chartData() {
      const steps = state.rows.get(Number($("phases-rank").value)) || new Map();
      const xs = [...steps.keys()].sort((a, b) => a - b);
      const out = [xs, ...phases.map(() => [])];
      for (const x of xs) {
        const row = steps.get(x), wall = wallOf(row);
        phases.forEach((p, i) => out[i + 1].push(isNum(row[p.field]) && wall > 0 ? pct(row[p.field], wall) : null));
      }
      return out;
    }

    function chartDraw() {
      const target = $("phases-chart");
      const data = chartData();
      if (chart) {
        chart.setData(data);
        return;
      }
      const muted = css.getPropertyValue("--muted").trim() || "#6b7280";
      const grid = { stroke: css.getPropertyValue("--grid").trim() || "rgba(0,0,0,.06)", width: 1 };
      chart = new uPlot({
        width: Math.max(200, target.clientWidth),
        height: 220,
        series: [{ label: "step" }, ...phases.map((p) => ({
          label: p.label, stroke: colorOf(p), width: 1.5, spanGaps: true,
          value: (u, v) => (isNum(v) ? v.toFixed(1) + "%" : "—"),
        }))],
        scales: { x: { time: false }, y: { range: [0, 100] } },
        // Steps tick at whole numbers, labelled as every chart's axes are (static/js/axis.js).
        axes: [
          { stroke: muted, grid, incrs: Axis.COUNT_INCRS, values: (u, ticks) => Axis.countLabels(ticks) },
          { stroke: muted, grid, values: (u, ticks) => Axis.labels(ticks, "%") },
        ],
      }, data, target);
      new ResizeObserver(() => chart.setSize({ width: Math.max(200, target.clientWidth), height: 220 })).observe(target);
    }

    function render() {
      pending = false;
      const any = state.latest.size > 0;
      $("phases-body").hidden = !any;
      const none = $("phases-none");
      // A run that ended without phases was not measured; a live one may still report them.
      none.hidden = any || !FINAL.has(state.status);
      setText(none, NOT_MEASURED);
      box.dataset.phasesState = any ? "drawn" : none.hidden ? "waiting" : "none";
      if (!any) return;
      setText($("phases-window"), isNum(state.lastStep) ? "latest window: up to step " + state.lastStep : "");
      barsDraw();
      rankSelectFill();
      if (typeof uPlot !== "undefined") chartDraw();
    }

    function schedule() {
      if (pending) return;
      pending = true;
      requestAnimationFrame(render);
    }

    legendDraw();
    $("phases-rank").addEventListener("change", () => chart && chart.setData(chartData()));
    const embedded = document.getElementById("experiment-snapshot");
    if (embedded) fromSnapshot(JSON.parse(embedded.textContent));
    render();
    // The statuses the end messages stand for, where they carry none.
    const ENDS = { finished: "succeeded", failed: "failed" };
    root.addEventListener("run:message", (event) => {
      const msg = event.detail || {};
      if (msg.type === "snapshot") fromSnapshot(msg);
      else if (msg.type === "step") {
        if (!fromStep(msg)) return;
      } else if (msg.type in ENDS) state.status = msg.status || ENDS[msg.type];
      else if (msg.type === "status" && msg.status) state.status = msg.status;
      else return;
      schedule();
    });

    // Tests read what is drawn: each rank's bar shares and the chart's arrays.
    window.TrainyardPhases = {
      drawn() {
        const bars = {};
        for (const li of document.querySelectorAll("#phase-bars li")) {
          bars[li.dataset.rank] = Object.fromEntries([...li.querySelectorAll("[data-phase]")].map((s) => [s.dataset.phase, Number(s.dataset.share)]));
        }
        return { bars, chart: chart ? chart.data.map((a) => Array.from(a)) : null, state: box.dataset.phasesState };
      },
    };
  }

  document.addEventListener("DOMContentLoaded", start);
})();
