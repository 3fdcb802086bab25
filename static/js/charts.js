// The one chart component of every page (the run page, the compare page): uPlot (vendored in
// static/vendor/uplot/, its README says the version) drawing a run's bucketed series as the server sends them
// (dashboard/experiments/metrics/series.py: [step_first, step_last, time_first, time_last, min, max,
// mean, last, n]). Each line is a min/max band with its mean on top, so that one spike among
// 100,000 points still shows however many points a bucket holds; live points append as
// one-point buckets. Why uPlot: Chart.js re-walks its datasets on every update (a 100,000-point
// run took 11-18 s to draw); uPlot draws typed arrays in one pass.
window.TrainyardCharts = (function () {
  "use strict";

  const { isNum, el, bytesText } = window.Trainyard;
  const Axis = window.TrainyardAxis;
  const Windows = window.TrainyardWindows;

  // Bucket fields, by index (the series contract).
  const SF = 0, SL = 1, TF = 2, TL = 3, MIN = 4, MAX = 5, MEAN = 6, N = 8;
  // Past this many buckets a live line merges neighbours pairwise: a run followed for hours
  // stays as light as the snapshot (min/max/mean stay exact, only the resolution halves).
  const LIVE_BUCKET_LIMIT = 2000;
  // uPlot series per line: min, max, mean, smoothed, short windows.
  const PER_LINE = 5;

  // The x axes of every chart (the shared contract): images seen and wall time are what make
  // runs with different global batches comparable.
  const X_MODES = [
    { id: "step", label: "Step" },
    { id: "images", label: "Images seen" },
    { id: "time", label: "Time since start" },
    { id: "wall", label: "Wall time" },
  ];

  // The series contract (dashboard/experiments/metrics/series_contract.py), sent in the page
  // facts: which series a chart draws, by key (`match`, a regular expression); `line` names one
  // line of a chart with several (per rank, machine, GPU; $1, $2: match's groups); `log` offers
  // the log scale; `factor` turns fractions into percent; `zero` starts the y axis at 0.
  const contract = window.Trainyard.facts.series;
  const lineName = (template) => (m) => template.replace(/\$(\d)/g, (_, i) => m[i]);
  const SPECS = contract.charts.map((spec) =>
    Object.assign({}, spec, {
      match: new RegExp(spec.match),
      line: spec.line ? lineName(spec.line) : undefined,
    }),
  );

  const css = getComputedStyle(document.documentElement);
  const cssVar = (name, fallback) => css.getPropertyValue(name).trim() || fallback;

  // Colours for lines that are not the page's single run (ranks, compared runs).
  const PALETTE = ["#4f46e5", "#db2777", "#059669", "#d97706", "#0891b2", "#7c3aed", "#dc2626", "#65a30d", "#475569", "#c026d3"];

  /** The chart and line a series key belongs to on a run page: {spec, line} or null. */
  function specOf(key) {
    for (const spec of SPECS) {
      const m = spec.match.exec(key);
      if (m) return { spec, line: spec.line ? spec.line(m) : spec.title };
    }
    return null;
  }

  /** A single-line chart's colour from the stylesheet; undefined picks from the palette. */
  const specColor = (spec) => (spec.color ? cssVar(spec.color, undefined) : undefined);

  /** The chart of one key on the compare and study pages, and the group of its line there:
   * {spec, group}. A per-rank (machine, GPU) figure is one chart whose lines are the runs, one
   * group per rank drawn at a time; a key the contract does not know (an imported run's own tag)
   * is a chart of its own, titled with the only name it has. */
  function keyChart(key) {
    const found = specOf(key);
    if (found) return { spec: found.spec, group: found.spec.line ? found.line : undefined };
    return { spec: { id: key, title: key, section: contract.other_section, log: /loss/.test(key) }, group: undefined };
  }

  // ---- live messages -> points ---------------------------------------------------------------

  const put = (out, key, step, time, value) => {
    if (!isNum(value)) return;
    (out[key] = out[key] || []).push([step, time, value]);
  };

  /** rank/<r>/<field> of each row of a message's per-rank list (a step's `ranks`, an epoch's
   * `memory`). */
  function putRanks(out, rows, fields, step, time) {
    for (const r of Array.isArray(rows) ? rows : []) {
      if (!r || !isNum(r.rank)) continue;
      for (const field of fields) put(out, "rank/" + r.rank + "/" + field, step, time, r[field]);
    }
  }

  /** The series points a live message carries: {key: [[step, time, value], ...]}, under the
   * keys the sink stores them (the contract's step_series, rank_fields, phase_fields,
   * epoch_series, memory_fields): step events carry the run's and each rank's figures; epoch events the test
   * figures, their own images/s and what each rank holds; `series` messages the rest (machine
   * and GPU samples). */
  function messagePoints(msg) {
    const out = {};
    if (!msg || !isNum(msg.step)) return msg && msg.type === "series" ? msg.points || {} : out;
    const t = isNum(msg.time) ? msg.time : null;
    if (msg.type === "step") {
      for (const [field, key] of Object.entries(contract.step_series)) put(out, key, msg.step, t, msg[field]);
      // A language model's ranks also say their tokens/s (protocol 1.15).
      const rankFields = contract.rank_fields.concat(contract.phase_fields, contract.language_rank_fields || []);
      putRanks(out, msg.ranks, rankFields, msg.step, t);
      // A script's observer says what each rank holds every window (protocol 1.12).
      putRanks(out, msg.memory, contract.memory_fields, msg.step, t);
    } else if (msg.type === "epoch") {
      for (const [field, key] of Object.entries(contract.epoch_series)) put(out, key, msg.step, t, msg[field]);
      // What each rank holds at the epoch's end (protocol 1.7's `memory`, as the sink stored it).
      putRanks(out, msg.memory, contract.memory_fields, msg.step, t);
    }
    return out;
  }

  // ---- values ----------------------------------------------------------------------------------

  /** TensorBoard's debiased exponential moving average: the EMA starts at 0, so its first values
   * lean toward 0 by weight^n; dividing by 1 - weight^n takes that bias out. */
  function smooth(values, weight) {
    const out = new Array(values.length);
    let last = 0;
    let n = 0;
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (!isNum(v)) {
        out[i] = v;
        continue;
      }
      last = last * weight + (1 - weight) * v;
      n += 1;
      out[i] = weight === 1 ? last : last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  /** Buckets merged pairwise (a live line past LIVE_BUCKET_LIMIT). */
  function halve(buckets) {
    const out = [];
    for (let i = 0; i < buckets.length; i += 2) {
      const a = buckets[i], b = buckets[i + 1];
      if (!b) { out.push(a); continue; }
      const na = a[N] || 0, nb = b[N] || 0;
      const pick = (f, x, y) => (x === null ? y : y === null ? x : f(x, y));
      const mean = na + nb ? ((a[MEAN] || 0) * na + (b[MEAN] || 0) * nb) / (na + nb) : null;
      out.push([a[SF], b[SL], a[TF], b[TL], pick(Math.min, a[MIN], b[MIN]), pick(Math.max, a[MAX], b[MAX]),
        mean, b[7] === null ? a[7] : b[7], na + nb]);
    }
    return out;
  }

  const XS = {
    step: (b) => b[SL],
    images: (b, ctx) => (isNum(ctx.globalBatch) ? b[SL] * ctx.globalBatch : null),
    time: (b) => b[TL],
    wall: (b, ctx) => (isNum(ctx.startedAt) && isNum(b[TL]) ? ctx.startedAt + b[TL] : null),
  };

  function numberText(v, unit) {
    if (!isNum(v)) return "—";
    if (unit === "bytes") return bytesText(v);
    const a = Math.abs(v);
    const text = a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(4));
    return unit === "%" ? text + "%" : text;
  }

  const wallFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });

  function xText(mode, x) {
    if (!isNum(x)) return "—";
    if (mode === "wall") return wallFormat.format(new Date(x * 1000));
    if (mode === "time") return x >= 120 ? (x / 60).toFixed(1) + " min" : x.toFixed(1) + " s";
    if (mode === "images") return Math.round(x).toLocaleString("en-US") + " images";
    return "step " + Math.round(x);
  }

  function alpha(color, a) {
    const m = /^#([0-9a-f]{6})$/i.exec(color.trim());
    if (!m) return color;
    const n = parseInt(m[1], 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  // ---- one chart ------------------------------------------------------------------------------

  class SeriesChart {
    /** card: the chart's <section> (made here when not on the page); options: {spec, xMode,
     * fetchRange(line, fromStep, toStep) -> Promise<{count, buckets}|null>} for zoom. */
    constructor(card, { spec, xMode, fetchRange }) {
      this.spec = spec;
      this.card = card;
      this.xMode = xMode || "step";
      this.fetchRange = fetchRange || null;
      this.lines = new Map(); // name -> {name, group, color, buckets, count, ctx, zoom}
      // Lines of several groups (a compare page's runs, per rank): the group drawn, picked in a
      // select (one chart per figure, not one per rank).
      this.pick = null;
      this.smoothing = 0;
      this.log = false;
      this.zoomed = false;
      this.u = null;
      this.pending = false;
      this.buildControls();
    }

    buildControls() {
      const card = this.card;
      const id = "chart-" + this.spec.id.replace(/[^a-z0-9_-]/gi, "-");
      this.box = card.querySelector(".chart-box") || card.appendChild(el("div", { class: "chart-box" }));
      this.box.id = id;
      this.empty = card.querySelector(".chart-empty");
      this.slider = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: "0", "aria-label": this.spec.title + ": smoothing" });
      this.sliderText = el("span", { class: "chart-smooth-value" }, "0");
      this.logBox = el("input", { type: "checkbox", "aria-label": this.spec.title + ": log scale" });
      this.reset = el("button", { type: "button", class: "button small chart-reset", hidden: "" }, "Reset zoom");
      this.picker = el("select", { class: "chart-pick", "aria-label": this.spec.title + ": which to draw", hidden: "" });
      this.note = el("p", { class: "chart-note muted small" });
      this.hover = el("div", { class: "chart-hover small", "aria-live": "off" });
      const controls = el("div", { class: "chart-controls small" }, [
        el("label", { title: "TensorBoard's debiased exponential moving average; the raw curve stays faint behind" }, ["Smoothing ", this.slider, " ", this.sliderText]),
        this.spec.log ? el("label", {}, [this.logBox, " log"]) : null,
        this.picker,
        this.reset,
      ]);
      let head = card.querySelector(".chart-head");
      if (!head) {
        head = el("div", { class: "chart-head" });
        card.prepend(head);
      }
      head.append(controls);
      this.box.after(this.hover, this.note);
      this.slider.addEventListener("input", () => {
        this.smoothing = Number(this.slider.value);
        this.sliderText.textContent = this.slider.value;
        this.rebuild();
      });
      this.logBox.addEventListener("change", () => {
        this.log = this.logBox.checked;
        this.rebuild();
      });
      this.reset.addEventListener("click", () => this.zoomReset());
      this.picker.addEventListener("change", () => {
        this.pick = this.picker.value;
        for (const line of this.lines.values()) line.zoom = null;
        this.zoomed = false;
        this.reset.hidden = true;
        this.rebuild();
      });
      new ResizeObserver(() => {
        if (this.u) this.u.setSize(this.size());
      }).observe(this.box);
    }

    size() {
      return { width: Math.max(200, this.box.clientWidth), height: Math.max(120, this.box.clientHeight - 4) };
    }

    /** Replace a line's buckets (a snapshot, or the metrics API). `meta` is the page's (which
     * series key and run the line draws), handed back to fetchRange. */
    setLine(name, { series, color, ctx, meta, group }) {
      const old = this.lines.get(name);
      this.lines.set(name, {
        name,
        group: group !== undefined ? group : old && old.group,
        meta: meta || (old && old.meta) || {},
        color: color || (old && old.color) || PALETTE[this.lines.size % PALETTE.length],
        buckets: (series && series.buckets) || [],
        count: (series && series.count) || 0,
        ctx: ctx || (old && old.ctx) || {},
        // A snapshot on reconnect while zoomed in keeps the finer buckets on screen.
        zoom: this.zoomed && old ? old.zoom : null,
      });
    }

    setContext(name, ctx) {
      const line = this.lines.get(name);
      if (line) Object.assign(line.ctx, ctx);
    }

    /** Live points [[step, time, value], ...] as one-point buckets at the end of a line. */
    append(name, points, { color, ctx, meta, group } = {}) {
      if (!this.lines.has(name)) this.setLine(name, { series: null, color, ctx, meta, group });
      const line = this.lines.get(name);
      for (const [step, time, v] of points) {
        const last = line.buckets[line.buckets.length - 1];
        // Already in the snapshot: ordered by (step, time), since machine and GPU samples keep
        // coming at one step while it lasts (an evaluation, a slow step).
        if (last && (step < last[SL] || (step === last[SL] && !(time > last[TL])))) continue;
        line.buckets.push([step, step, time, time, v, v, v, v, 1]);
        line.count += 1;
      }
      while (line.buckets.length > LIVE_BUCKET_LIMIT) line.buckets = halve(line.buckets);
      this.schedule();
    }

    /** The lines drawn: every line, or the picked group's where lines come in groups. */
    shown() {
      const all = [...this.lines.values()];
      if (this.pick === null) return all;
      return all.filter((l) => l.group === undefined || l.group === this.pick);
    }

    /** The group select: hidden below two groups; the first group drawn until one is picked. */
    renderPicker() {
      const groups = [...new Set([...this.lines.values()].map((l) => l.group).filter((g) => g !== undefined))];
      this.picker.hidden = groups.length < 2;
      if (!groups.length) {
        this.pick = null;
        return;
      }
      if (!groups.includes(this.pick)) this.pick = groups[0];
      if (this.picker.options.length !== groups.length) {
        this.picker.replaceChildren(...groups.map((g) => el("option", { value: g }, g)));
      }
      this.picker.value = this.pick;
    }

    setXMode(mode) {
      this.xMode = mode;
      for (const line of this.lines.values()) line.zoom = null;
      this.zoomed = false;
      this.reset.hidden = true;
      this.rebuild();
    }

    schedule() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => {
        this.pending = false;
        this.redraw();
      });
    }

    /** The arrays drawn: x, then per line [min, max, mean, smoothed, short], joined on x. A
     * window chart (the contract's `window`: "sum" draws per step) marks its short windows'
     * points in `short` (static/js/windows.js); line.shortAt keeps their step counts by x. */
    tables() {
      const f = this.spec.factor || 1;
      const keep = this.log ? (v) => (isNum(v) && v > 0 ? v * f : null) : (v) => (isNum(v) ? v * f : null);
      const kind = this.spec.window;
      const tables = [];
      for (const line of this.shown()) {
        const toX = XS[this.xMode];
        let buckets = line.zoom || line.buckets;
        const steps = kind ? Windows.covered(buckets, line.buckets) : null;
        const short = kind ? Windows.short(buckets, steps) : null;
        if (kind === "sum") buckets = Windows.perStep(buckets, steps);
        line.usual = kind ? Windows.usual(buckets, steps) : null;
        line.shortAt = new Map();
        const xs = [], mins = [], maxs = [], means = [], marks = [];
        buckets.forEach((b, i) => {
          const x = toX(b, line.ctx);
          if (!isNum(x) || (xs.length && x <= xs[xs.length - 1])) return;
          xs.push(x);
          mins.push(keep(b[MIN]));
          maxs.push(keep(b[MAX]));
          means.push(keep(b[MEAN]));
          const isShort = short && short[i] !== null;
          marks.push(isShort ? keep(b[MEAN]) : null);
          if (isShort) line.shortAt.set(x, short[i]);
        });
        tables.push([xs, mins, maxs, means, this.smoothing > 0 ? smooth(means, this.smoothing) : means.map(() => null), marks]);
      }
      return tables;
    }

    data() {
      const tables = this.tables();
      if (tables.length === 1) return tables[0];
      if (!tables.length) return [[]];
      return uPlot.join(tables);
    }

    options() {
      const series = [{ label: "x" }];
      const bands = [];
      const smoothing = this.smoothing > 0;
      for (const line of this.shown()) {
        const base = series.length;
        const faint = alpha(line.color, 0.35);
        const common = { spanGaps: true, points: { show: false } };
        series.push(Object.assign({ label: line.name + " min", stroke: faint, width: 1 }, common));
        series.push(Object.assign({ label: line.name + " max", stroke: faint, width: 1 }, common));
        // uPlot's own rule dots the mean while its points are sparse: one point alone shows.
        series.push({ label: line.name, stroke: smoothing ? alpha(line.color, 0.4) : line.color, width: smoothing ? 1 : 1.5, spanGaps: true });
        series.push(Object.assign({ label: line.name + " smoothed", stroke: line.color, width: 2, show: smoothing }, common));
        // A short window's point: a hollow dot on the line, no line of its own.
        series.push({ label: line.name + " short window", stroke: cssVar("--chart-short", "#d97706"), fill: cssVar("--surface", "#fff"), width: 2, paths: () => null, points: { show: true, size: 9 } });
        bands.push({ series: [base + 1, base], fill: alpha(line.color, 0.15) });
      }
      const axis = { stroke: cssVar("--muted", "#6b7280"), grid: { stroke: cssVar("--grid", "rgba(0,0,0,.06)"), width: 1 }, ticks: { width: 1, stroke: cssVar("--grid", "rgba(0,0,0,.06)") } };
      return Object.assign(this.size(), {
        series,
        bands,
        legend: { show: false },
        // The scale is set here (onSelect), after reading the selection in the old one.
        cursor: { drag: { x: true, y: false, setScale: false }, points: { show: false } },
        scales: { x: { time: this.xMode === "wall" }, y: this.yScale() },
        axes: [Object.assign({}, axis, this.xAxis()), Object.assign({}, axis, this.yAxis())],
        hooks: {
          setSelect: [(u) => this.onSelect(u)],
          setCursor: [(u) => this.onCursor(u)],
        },
      });
    }

    /** The x axis' ticks and labels (static/js/axis.js): steps and images are counts, ticked at
     * whole numbers; wall time is uPlot's clock. */
    xAxis() {
      if (this.xMode === "wall") return {};
      if (this.xMode === "time") return { values: (u, ticks) => Axis.labels(ticks) };
      return { incrs: Axis.COUNT_INCRS, values: (u, ticks) => Axis.countLabels(ticks) };
    }

    /** The y axis: one unit, just enough decimals, a gutter as wide as its widest label; on a
     * log scale each tick has its own exponent (1e-4, 1e-3). */
    yAxis() {
      const unit = this.spec.unit;
      const values = this.log
        ? (u, ticks) => ticks.map((t) => Axis.labels([t], unit)[0])
        : (u, ticks) => Axis.labels(ticks, unit);
      const out = { values, size: (u, texts) => Axis.gutter(texts) };
      if (unit === "bytes" && !this.log) out.incrs = Axis.BYTE_INCRS;
      return out;
    }

    /** The y scale: log when toggled; from 0 for sizes (`zero`), whose level is the point: an
     * auto range would blow a few bytes' difference between ranks up to the chart's height. */
    yScale() {
      if (this.log) return { distr: 3 };
      if (!this.spec.zero) return { distr: 1 };
      return { distr: 1, range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] };
    }

    /** Draw from scratch: the series' styles depend on smoothing and the scale on the toggle. */
    rebuild() {
      if (this.u) {
        this.u.destroy();
        this.u = null;
      }
      this.redraw();
    }

    redraw() {
      this.renderPicker();
      const shown = this.shown();
      const any = shown.some((l) => l.buckets.length);
      if (this.empty) this.empty.hidden = any;
      this.renderLegend();
      if (!any || typeof uPlot === "undefined") {
        this.renderNote();
        return;
      }
      // The note after the data: drawing finds the short windows it mentions.
      if (this.u && this.u.series.length === 1 + PER_LINE * shown.length) {
        this.u.setData(this.data(), !this.zoomed);
      } else {
        if (this.u) this.u.destroy();
        this.u = new uPlot(this.options(), this.data(), this.box);
        this.u.over.addEventListener("dblclick", () => this.zoomReset());
        if (this.zoomed && this.zoomRange) this.u.setScale("x", this.zoomRange);
      }
      this.renderNote();
    }

    renderNote() {
      const shown = this.shown();
      const bucketed = shown.some((l) => l.count > (l.zoom || l.buckets).length);
      let text = "";
      if (bucketed) text = "Each bucket drawn as its min–max band and its mean";
      const short = shown.some((l) => l.shortAt && l.shortAt.size);
      if (short) text = (text ? text + ". " : "") + "Ringed points: windows shorter than most (an epoch's last steps)" + (this.spec.window === "sum" ? ", drawn per step as the others" : "");
      if (this.smoothing > 0) {
        text = bucketed
          ? "Smoothing the bucket means (the server groups many points per bucket), not the raw points"
          : "Smoothing the raw points";
      }
      this.note.textContent = text ? text + "." : "";
    }

    renderLegend() {
      const shown = this.shown();
      if (this.legend) this.legend.hidden = shown.length < 2;
      if (shown.length < 2) return;
      if (!this.legend) {
        this.legend = el("ul", { class: "chart-legend small" });
        this.box.before(this.legend);
      }
      const names = shown.map((l) => l.name).join("\n");
      if (this.legend.dataset.names === names) return;
      this.legend.dataset.names = names;
      this.legend.replaceChildren(...shown.map((l) => el("li", {}, [
        el("span", { class: "swatch", style: "background:" + l.color }), l.name,
      ])));
    }

    onCursor(u) {
      const i = u.cursor.idx;
      if (i === null || i === undefined) {
        this.hover.textContent = "";
        return;
      }
      const unit = this.spec.unit;
      const parts = [xText(this.xMode, u.data[0][i])];
      let s = 1;
      const shown = this.shown();
      for (const line of shown) {
        const mean = u.data[s + 2][i], min = u.data[s][i], max = u.data[s + 1][i], sm = u.data[s + 3][i];
        s += PER_LINE;
        if (!isNum(mean)) continue;
        let text = (shown.length > 1 ? line.name + ": " : "") + numberText(mean, unit);
        if (isNum(min) && isNum(max) && min !== max) text += " (" + numberText(min, unit) + "–" + numberText(max, unit) + ")";
        if (isNum(sm)) text += ", smoothed " + numberText(sm, unit);
        const steps = line.shortAt && line.shortAt.get(u.data[0][i]);
        if (steps) text += ", a window of " + steps + (steps === 1 ? " step" : " steps") + " (most have " + line.usual + ")";
        parts.push(text);
      }
      this.hover.textContent = parts.join(" · ");
    }

    /** A drag zoomed the x scale: ask the server for finer buckets of each line's step range. */
    onSelect(u) {
      if (u.select.width < 5) return;
      const lo = u.posToVal(u.select.left, "x");
      const hi = u.posToVal(u.select.left + u.select.width, "x");
      u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
      u.setScale("x", { min: lo, max: hi });
      this.zoomTo(lo, hi);
    }

    async zoomTo(lo, hi) {
      this.zoomed = true;
      this.zoomRange = { min: lo, max: hi };
      this.reset.hidden = false;
      if (!this.fetchRange) return;
      const toX = XS[this.xMode];
      const asked = this.shown().map(async (line) => {
        let from = null, to = null;
        for (const b of line.buckets) {
          const x = toX(b, line.ctx);
          if (!isNum(x)) continue;
          // x is a bucket's last step (or time). From the last bucket ending before lo (the
          // line runs to the edge) to the first ending past hi: that one holds the selection's
          // last steps, and all of them when the selection lies inside one bucket.
          if (x < lo) from = b[SF];
          else if (from === null) from = b[SF];
          to = b[SL];
          if (x > hi) break;
        }
        if (from === null) return;
        const finer = await this.fetchRange(line, from, to);
        if (finer && this.zoomed) line.zoom = finer.buckets;
      });
      await Promise.all(asked);
      if (!this.zoomed) return;
      this.redraw();
      if (this.u) this.u.setScale("x", this.zoomRange);
    }

    zoomReset() {
      for (const line of this.lines.values()) line.zoom = null;
      this.zoomed = false;
      this.reset.hidden = true;
      if (this.u) this.u.setData(this.data(), true);
      this.renderNote();
    }

    /** What is drawn, for tests and benchmarks: x and per line its four arrays. */
    drawn() {
      if (!this.u) return null;
      const out = { x: Array.from(this.u.data[0]), xMode: this.xMode, log: this.u.scales.y.distr === 3, lines: {} };
      let s = 1;
      for (const { name } of this.shown()) {
        const [min, max, mean, smoothed, short] = [0, 1, 2, 3, 4].map((k) => Array.from(this.u.data[s + k]));
        const dotted = this.u.series[s + 2].points.show(this.u, s + 2);
        out.lines[name] = { min, max, mean, smoothed, short, dotted };
        s += PER_LINE;
      }
      return out;
    }
  }

  // ---- a page of charts -------------------------------------------------------------------------

  /** A chart card like templates/experiments/_chart_card.html's, for charts the server did not
   * render (series that appear later, the compare page's). */
  function cardMake(container, spec, before) {
    const card = el("section", { class: "card chart-card", "data-chart": spec.id }, [
      el("div", { class: "chart-head" }, el("h2", {}, spec.title)),
      el("div", { class: "chart-box" }),
    ]);
    container.insertBefore(card, before || null);
    return card;
  }

  /** The charts of one container, made on demand by id. */
  class ChartSet {
    constructor(container, { xMode, fetchRange } = {}) {
      this.container = container;
      this.xMode = xMode || "step";
      this.fetchRange = fetchRange;
      this.charts = new Map();
      for (const card of container.querySelectorAll("[data-chart]")) {
        const spec = SPECS.find((s) => s.id === card.dataset.chart);
        if (spec) this.chart(spec);
      }
    }

    chart(spec) {
      let chart = this.charts.get(spec.id);
      if (!chart) {
        // In SPECS order whenever a series first appears (a machine's CPU after the losses).
        // In its section's grid where the page has one (the contract's `section`), else here.
        const home = this.homeOf(spec);
        const rank = (id) => { const i = SPECS.findIndex((s) => s.id === id); return i < 0 ? SPECS.length : i; };
        let next = null;
        for (const c of this.charts.values()) {
          if (c.card.parentNode !== home) continue;
          if (rank(c.spec.id) > rank(spec.id) && (!next || rank(c.spec.id) < rank(next.spec.id))) next = c;
        }
        const card = document.querySelector('[data-chart="' + CSS.escape(spec.id) + '"]') || cardMake(home, spec, next && next.card);
        chart = new SeriesChart(card, { spec, xMode: this.xMode, fetchRange: this.fetchRange });
        this.charts.set(spec.id, chart);
        registry.set(spec.id, chart);
      }
      return chart;
    }

    homeOf(spec) {
      const section = spec.section || contract.other_section;
      return document.querySelector('[data-section-charts="' + section + '"]') || this.container;
    }

    setXMode(mode) {
      this.xMode = mode;
      for (const chart of this.charts.values()) chart.setXMode(mode);
    }

    redrawAll() {
      for (const chart of this.charts.values()) chart.rebuild();
    }
  }

  /** Fill an x-axis <select> with the modes and follow it. */
  function xSelectBind(select, set) {
    select.replaceChildren(...X_MODES.map((m) => el("option", { value: m.id }, m.label)));
    select.value = set.xMode;
    select.addEventListener("change", () => set.setXMode(select.value));
  }

  /** The compare page's speedup and efficiency against world size (scaling.scaling_chart_build):
   * per strategy its speedup (left axis, solid) and efficiency (right axis, dotted), and the
   * ideal speedup = world size; uPlot's legend gives the values under the cursor. */
  function scalingChart(box, data, labelOf) {
    if (!box || !data || !data.world_sizes.length || typeof uPlot === "undefined") return null;
    const empty = box.querySelector(".chart-empty");
    if (empty) empty.hidden = true;
    const muted = cssVar("--muted", "#6b7280");
    const series = [
      { label: "world size" },
      { label: "ideal", stroke: muted, dash: [5, 5], width: 1, scale: "speedup", value: (u, v) => numberText(v) + "×" },
    ];
    const rows = [data.world_sizes, data.world_sizes.slice()];
    data.lines.forEach((line, i) => {
      const color = PALETTE[i % PALETTE.length];
      const name = labelOf(line.strategy);
      series.push({ label: name + " speedup", stroke: color, width: 2, scale: "speedup", points: { show: true, size: 8 }, spanGaps: true, value: (u, v) => numberText(v) + "×" });
      series.push({ label: name + " efficiency", stroke: alpha(color, 0.7), dash: [2, 3], width: 2, scale: "eff", points: { show: true, size: 6 }, spanGaps: true, value: (u, v) => numberText(v, "%") });
      rows.push(line.speedup, line.efficiency.map((v) => (isNum(v) ? v * 100 : null)));
    });
    const grid = { stroke: cssVar("--grid", "rgba(0,0,0,.06)"), width: 1 };
    const opts = {
      width: Math.max(200, box.clientWidth),
      height: 220,
      series,
      scales: { x: { time: false }, eff: { range: [0, 110] } },
      axes: [
        { stroke: muted, grid, label: "world size", values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : "")) },
        { scale: "speedup", stroke: muted, grid, label: "speedup ×" },
        { scale: "eff", side: 1, stroke: muted, grid: { show: false }, label: "efficiency %" },
      ],
    };
    return new uPlot(opts, rows, box);
  }

  // Every chart on the page by id: tests and bench_charts read what is drawn through it.
  const registry = new Map();

  return { SPECS, X_MODES, PALETTE, specOf, specColor, keyChart, messagePoints, smooth, numberText, SeriesChart, ChartSet, xSelectBind, scalingChart, instances: registry };
})();
