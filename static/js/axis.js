// The axes' labels of every chart (static/js/charts.js): one unit per axis (bytes in the unit of
// the axis' largest tick, never "977.5 MiB" beside "1.0 GiB"), just enough decimals that
// neighbouring ticks differ (no "1.0 GiB / 1.0 GiB"), small and large numbers with one exponent
// per axis ("1.5e-4"), and a gutter as wide as its widest label, so no label loses its first
// characters. Counts (steps, images) tick at whole numbers only. Depends on nothing, so that
// tests/test_pages_browser.py can load it alone in a blank page.
window.TrainyardAxis = (function () {
  "use strict";

  const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  const MAX_DECIMALS = 6;
  // uPlot's default axis font, and its tick length plus gap on either side of a label.
  const FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
  const GUTTER_PAD = 18;

  const finite = (v) => typeof v === "number" && Number.isFinite(v);

  /** Just enough decimals (0..6): the fewest at which every tick reads exactly (ticks are round
   * numbers: 0.25 keeps two), else the fewest at which no two neighbours read the same (bytes
   * scaled to their unit are seldom round). */
  function decimals(values) {
    const exact = (d) => values.every((v) => Math.abs(v - +v.toFixed(d)) <= Math.abs(v) * 1e-9);
    const differ = (d) => values.every((v, i) => i === 0 || v.toFixed(d) !== values[i - 1].toFixed(d));
    for (let d = 0; d <= MAX_DECIMALS; d++) if (exact(d)) return d;
    for (let d = 0; d <= MAX_DECIMALS; d++) if (differ(d)) return d;
    return MAX_DECIMALS;
  }

  /** Each value with the same decimals and `suffix`; -0 reads 0. */
  function fixed(values, suffix) {
    const d = decimals(values);
    return values.map((v) => {
      const text = v.toFixed(d);
      return (/^-0(\.0*)?$/.test(text) ? text.slice(1) : text) + suffix;
    });
  }

  /** Labels of the ticks of a value axis. unit: "bytes", "%" or none. */
  function labels(ticks, unit) {
    const shown = ticks.filter(finite);
    const out = ticks.map(() => "");
    if (!shown.length) return out;
    const top = Math.max(...shown.map(Math.abs));
    let texts;
    if (unit === "bytes") {
      let i = 0;
      while (i < BYTE_UNITS.length - 1 && top >= Math.pow(1024, i + 1)) i++;
      const scale = Math.pow(1024, i);
      texts = fixed(shown.map((v) => v / scale), " " + BYTE_UNITS[i]);
    } else if (top !== 0 && (top >= 1e5 || top < 1e-2)) {
      // One exponent for the axis, the largest tick's: 1.0e-4, 1.5e-4, 2.0e-4.
      const e = Math.floor(Math.log10(top));
      const mantissas = fixed(shown.map((v) => v / Math.pow(10, e)), "");
      texts = mantissas.map((m) => (/^0(\.0*)?$/.test(m) ? "0" : m + "e" + e));
    } else {
      texts = fixed(shown, "");
    }
    if (unit === "%") texts = texts.map((t) => t + "%");
    let k = 0;
    ticks.forEach((v, i) => {
      if (finite(v)) out[i] = texts[k++];
    });
    return out;
  }

  /** Labels of a count axis (steps, images): whole numbers, thousands as "12.5k". */
  function countLabels(ticks) {
    const shown = ticks.filter(finite);
    if (!shown.length) return ticks.map(() => "");
    const top = Math.max(...shown.map(Math.abs));
    const texts = top >= 1e4 ? fixed(shown.map((v) => v / 1000), "k") : shown.map((v) => String(Math.round(v)));
    let k = 0;
    return ticks.map((v) => (finite(v) ? texts[k++] : ""));
  }

  // Whole-number tick steps for a count axis: 1, 2, 5, 10, 20, 50, ... (never 0.25 of a step).
  const COUNT_INCRS = [];
  for (let p = 1; p <= 1e15; p *= 10) COUNT_INCRS.push(p, 2 * p, 5 * p);

  // Tick steps of a bytes axis, round in its units: 1, 2, 5, 10, 20, 50, 100, 200, 500 B, KiB, ...
  const BYTE_INCRS = [];
  for (let i = 0; i < BYTE_UNITS.length; i++) {
    for (const m of [1, 2, 5, 10, 20, 50, 100, 200, 500]) BYTE_INCRS.push(m * Math.pow(1024, i));
  }

  let measurer = null;
  /** The width in CSS pixels of `text` in the axis font. */
  function textWidth(text) {
    if (!measurer && typeof document !== "undefined") {
      measurer = document.createElement("canvas").getContext("2d");
      measurer.font = FONT;
    }
    return measurer ? measurer.measureText(text).width : text.length * 7;
  }

  /** A y axis' gutter: its widest label and the tick's room (uPlot's axis `size`). */
  function gutter(texts) {
    let widest = 0;
    for (const t of texts || []) if (t) widest = Math.max(widest, textWidth(t));
    return Math.ceil(widest + GUTTER_PAD);
  }

  return { labels, countLabels, COUNT_INCRS, BYTE_INCRS, gutter, textWidth, FONT };
})();
