// The engine reports a window of steps at a time (every --log-interval steps, step 1 alone, and
// the epoch's last step), so an epoch's last window is short: 7 steps where the others have 20.
// A figure summed over its window (seconds of compute, bytes sent) then reads as a drop that is
// only a shorter window, and a rate over it (images/s) includes the epoch's smaller last batch.
// Charts of sums draw them per step; every window chart marks a short window's point (issue 34,
// item 9). The steps a point covers come from the x axis itself: from the previous point's last
// step to its own, as the engine's windows run (training/engine.py).
window.TrainyardWindows = (function () {
  "use strict";

  const { isNum } = window.Trainyard;
  const SF = 0, SL = 1, MIN = 4, MAX = 5, MEAN = 6, LAST = 7, N = 8;
  // A window this much shorter than the usual one is marked: 19 of 20 steps reads the same.
  const SHORT = 0.75;

  /** The steps each bucket's windows cover. A zoom's finer buckets start inside the run: the
   * one before the first is the last of the `whole` line's buckets ending before it (a line's
   * buckets partition its points, and the zoom asks from a bucket's first step). */
  function covered(buckets, whole) {
    let prev = null;
    if (buckets.length && whole && whole !== buckets) {
      for (const b of whole) {
        if (b[SL] >= buckets[0][SF]) break;
        prev = b[SL];
      }
    }
    const first = prev === null;
    const steps = buckets.map((b) => {
      const n = b[SL] - (prev === null ? 0 : prev);
      prev = b[SL];
      return n;
    });
    // A line's first point covers from step 0 where the engine wrote it (its step-1 window);
    // one that starts later (an imported run, a script joined late) has no window before it
    // to measure: it counts as a usual one, not as all the steps since 0.
    const u = usual(buckets, steps);
    if (first && steps.length && (buckets[0][N] || 1) === 1 && u !== null && steps[0] > u) steps[0] = u;
    return steps;
  }

  /** Each bucket's figures per step: a bucket of n windows summing to mean * n over `steps`
   * steps. Its band is scaled by its mean window, exact for one window. */
  function perStep(buckets, steps) {
    return buckets.map((b, i) => {
      const n = b[N] || 1;
      const k = steps[i] > 0 ? n / steps[i] : null;
      const scale = (v) => (isNum(v) && k !== null ? v * k : null);
      return [b[0], b[1], b[2], b[3], scale(b[MIN]), scale(b[MAX]), scale(b[MEAN]), scale(b[LAST]), b[N]];
    });
  }

  /** The usual window: the most common step count among one-window buckets (the larger on a
   * tie), or null where fewer than three say. */
  function usual(buckets, steps) {
    const seen = new Map();
    buckets.forEach((b, i) => {
      if ((b[N] || 1) === 1 && steps[i] > 0) seen.set(steps[i], (seen.get(steps[i]) || 0) + 1);
    });
    let best = null, count = 0, total = 0;
    for (const [s, c] of seen) {
      total += c;
      if (c > count || (c === count && s > best)) [best, count] = [s, c];
    }
    return total >= 3 ? best : null;
  }

  /** For each bucket: its step count where it is one window shorter than the usual, else null. */
  function short(buckets, steps) {
    const u = usual(buckets, steps);
    return buckets.map((b, i) => ((b[N] || 1) === 1 && u !== null && steps[i] < u * SHORT ? steps[i] : null));
  }

  return { covered, perStep, usual, short };
})();
