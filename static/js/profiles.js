// The run page's profile panel (templates/experiments/_profiles.html): the Profile button, the
// latest profile's progress (requested, recording, ready or failed) and, once ready, its traces
// and per-rank summary. It follows the run's messages (experiment_detail.js announces each as
// a "run:message" event): `profile` messages carry the profile as it now stands (`view`, from
// core/profiles.py, texts included), status messages say whether the run still runs. Nothing
// here writes a text the server could: the panel only places what it is sent.
// Included with the panel, before common.js in the page: it starts once every deferred script
// (common.js's Trainyard included) has run.
document.addEventListener("DOMContentLoaded", function () {
  "use strict";
  const panel = document.getElementById("profiles");
  const root = document.getElementById("experiment-detail");
  if (!panel || !root) return;
  const { el, setText, csrfToken } = window.Trainyard;
  const $ = (id) => document.getElementById(id);
  const form = $("profile-form");
  const button = $("profile-button");
  const latestEl = $("profile-latest");
  const state = {
    status: panel.dataset.status, // the run's
    latest: latestEl ? JSON.parse(latestEl.textContent) : null,
    sending: false,
  };

  function sayError(text) {
    setText($("profile-error"), text);
    $("profile-error").hidden = !text;
  }

  function renderButton() {
    if (!button) return;
    const inFlight = Boolean(state.latest && state.latest.in_flight);
    button.disabled = state.sending || inFlight || state.status !== "running";
    button.textContent = inFlight || state.sending ? "Profiling…" : "Profile";
    // A run that has ended takes no request: the form goes, the result stays.
    form.hidden = state.status !== "running" && state.status !== "queued";
  }

  function tracesList(traces) {
    return el("ul", { class: "profile-traces" }, traces.map((t) =>
      el("li", {}, [
        el("a", { href: t.url, download: "" }, "rank " + t.rank + " trace"),
        " ", el("span", { class: "muted small" }, t.bytes_text + ", " + t.steps + " step(s)"),
      ])));
  }

  function opsTable(ops) {
    const head = el("tr", {}, ["Operator", "Calls", "Self CPU", "Share"].map((h, i) =>
      el("th", { scope: "col", class: i ? "num" : "" }, h)));
    const rows = ops.map((op) => el("tr", {}, [
      el("td", { class: "profile-op" }, op.name),
      el("td", { class: "num" }, String(op.calls)),
      el("td", { class: "num" }, op.self_text),
      el("td", { class: "num" }, op.share_text),
    ]));
    return el("table", { class: "profile-ops" }, [el("thead", {}, head), el("tbody", {}, rows)]);
  }

  function rankSummary(s) {
    return el("div", { class: "profile-rank", "data-rank": String(s.rank) }, [
      el("h3", {}, "Rank " + s.rank),
      el("p", { class: "small" }, [
        "Traced " + s.wall_text + " (" + s.device + "): computation " + s.computation_text +
        ", communication " + s.communication_text + " (" + s.overlap_text + ").",
      ]),
      opsTable(s.ops || []),
    ]);
  }

  function renderLatest() {
    const p = state.latest;
    if (p) setText($("profile-state"), p.state_text);
    const parts = [];
    if (p && p.traces.length) parts.push(tracesList(p.traces));
    for (const d of (p && p.dropped) || []) {
      parts.push(el("p", { class: "small warning" }, "Rank " + d.rank + ": " + d.dropped));
    }
    if (p) parts.push(...p.summary.map(rankSummary));
    $("profile-result").replaceChildren(...parts);
    renderButton();
  }

  async function refresh() {
    try {
      const response = await fetch(panel.dataset.latestUrl, {
        credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store",
      });
      if (!response.ok) return;
      state.latest = (await response.json()).profile;
      renderLatest();
    } catch (err) {
      // The next message will bring it.
    }
  }

  async function request(event) {
    event.preventDefault();
    sayError("");
    state.sending = true;
    renderButton();
    try {
      const response = await fetch(panel.dataset.requestUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          "X-CSRFToken": csrfToken(), Accept: "application/json", "Content-Type": "application/json",
        },
        body: JSON.stringify({ steps: Number($("profile-steps").value) }),
      });
      let body = {};
      try { body = await response.json(); } catch (err) { body = {}; }
      if (!response.ok) {
        const field = body.errors && body.errors.steps ? ": " + body.errors.steps.join(" ") : "";
        throw new Error((body.error || "the server answered " + response.status) + field);
      }
      state.latest = body;
    } catch (err) {
      sayError("Could not ask for a profile: " + err.message + ".");
    }
    state.sending = false;
    renderLatest();
  }

  function onMessage(msg) {
    if (msg.type === "profile") {
      if (msg.view) state.latest = msg.view;
      renderLatest();
    } else if (msg.type === "snapshot" && msg.experiment) {
      state.status = msg.experiment.status;
      refresh(); // a page that reconnects may have missed a profile message
    } else if (typeof msg.status === "string" && ["status", "finished", "failed"].includes(msg.type)) {
      state.status = msg.status;
      // An attempt's end fails its profile in flight: show how it ended.
      if (state.latest && state.latest.in_flight && msg.status !== "running") refresh();
      renderButton();
    }
  }

  if (form) form.addEventListener("submit", request);
  root.addEventListener("run:message", (event) => onMessage(event.detail));
  renderLatest();
});
